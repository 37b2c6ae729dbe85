#!/usr/bin/env python3
"""Helm v4's engine for the project's charts, without a helm binary.

The engine is the Helm Go SDK bundled by the helm-python-sdk wheel (install-deps.sh puts it in
$HELM_PYTHON_DIR). This is a thin command-line front for the Rust side (mesh-charts), which
passes values as JSON on standard input and reads JSON back:

  helm.py render CHART_DIR --name RELEASE --namespace NS   < values.json
      -> {"manifests": {"<chart>/templates/<file>": "<yaml>", ...}}
  helm.py lint CHART_DIR [--strict] [--kube-version v1.33.0] [--namespace NS] < values.json
      -> {"total_charts_linted": N, "messages": [{"severity", "path", "error"}], "errors": [...]}

A Helm failure (a template's `fail`, a bad value) exits 1 with Helm's message on standard
error; a missing engine exits 3 and says how to install it.
"""

import argparse
import json
import os
import sys


def load_engine():
    engine_dir = os.environ.get("HELM_PYTHON_DIR", "/opt/mesh-deps/helm-python-0.2.2")
    sys.path.insert(0, engine_dir)
    try:
        import helm_python  # noqa: PLC0415 (its place is only known at run time)
    except ImportError as e:
        sys.stderr.write(
            f"helm.py: Helm's engine is not installed in {engine_dir} ({e}); "
            "run scripts/install-deps.sh or set HELM_PYTHON_DIR\n"
        )
        sys.exit(3)
    return helm_python


def read_values():
    text = sys.stdin.read() if not sys.stdin.isatty() else ""
    if not text.strip():
        return {}
    values = json.loads(text)
    if not isinstance(values, dict):
        raise ValueError("values must be a JSON object")
    return values


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    render = sub.add_parser("render", help="render a chart's templates offline")
    render.add_argument("chart")
    render.add_argument("--name", required=True)
    render.add_argument("--namespace", required=True)
    lint = sub.add_parser("lint", help="lint a chart")
    lint.add_argument("chart")
    lint.add_argument("--strict", action="store_true")
    lint.add_argument("--kube-version")
    lint.add_argument("--namespace")
    args = parser.parse_args()

    helm = load_engine()
    try:
        values = read_values()
        if args.command == "render":
            chart = helm.Chart.load(args.chart)
            manifests = chart.render(
                values, name=args.name, namespace=args.namespace, is_install=True
            )
            json.dump({"manifests": manifests}, sys.stdout)
        else:
            report = helm.lint(
                args.chart,
                values,
                strict=args.strict,
                namespace=args.namespace,
                kube_version=args.kube_version,
            )
            json.dump(report, sys.stdout)
    except helm.HelmError as e:
        sys.stderr.write(f"{e}\n")
        sys.exit(1)
    except ValueError as e:
        sys.stderr.write(f"helm.py: bad values on standard input: {e}\n")
        sys.exit(2)


if __name__ == "__main__":
    main()
