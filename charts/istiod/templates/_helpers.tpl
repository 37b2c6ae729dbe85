{{- /* "-<revision>" or nothing. */ -}}
{{- define "istiod.suffix" -}}
{{- with .Values.revision }}-{{ . }}{{ end }}
{{- end }}

{{- define "istiod.name" -}}
istiod{{ include "istiod.suffix" . }}
{{- end }}

{{- define "istiod.namespaced" -}}
{{- if has .Values.global.resourceScope (list "all" "namespace") }}true{{ end }}
{{- end }}
{{- define "istiod.cluster" -}}
{{- if has .Values.global.resourceScope (list "all" "cluster") }}true{{ end }}
{{- end }}

{{- /* Labels of the control plane's objects, as Istio's chart sets them. */ -}}
{{- define "istiod.labels" -}}
istio.io/rev: {{ .Values.revision | default "default" | quote }}
install.operator.istio.io/owning-resource: {{ .Values.ownerName | default "unknown" }}
operator.istio.io/component: "Pilot"
release: {{ .Release.Name }}
app.kubernetes.io/name: "istiod"
{{ include "istio.labels" . }}
{{- end }}

{{- /* Labels of the RBAC objects. */ -}}
{{- define "istiod.rbacLabels" -}}
app: istiod
release: {{ .Release.Name }}
app.kubernetes.io/name: "istiod"
{{ include "istio.labels" . }}
{{- end }}

{{- /* The pods the Deployment selects (immutable: as Istio's, so an upgrade from it works). */ -}}
{{- define "istiod.deploymentSelector" -}}
{{- if .Values.revision }}
app: istiod
istio.io/rev: {{ .Values.revision | quote }}
{{- else }}
istio: pilot
{{- end }}
{{- end }}

{{- /* The pods the Service and PodDisruptionBudget select. */ -}}
{{- define "istiod.selector" -}}
app: istiod
{{- if .Values.revision }}
istio.io/rev: {{ .Values.revision | quote }}
{{- else }}
istio: pilot
{{- end }}
{{- end }}

{{- /* What every sidecar injector webhook shares (mutatingwebhook.yaml). */ -}}
{{- define "mesh.injector.core" }}
    clientConfig:
      service:
        name: {{ include "istiod.name" .root }}
        namespace: {{ .root.Values.global.istioNamespace }}
        path: {{ .root.Values.sidecarInjectorWebhook.injectionPath | quote }}
        port: 443
    sideEffects: None
    rules:
      - operations: [CREATE]
        apiGroups: [""]
        apiVersions: ["v1"]
        resources: ["pods"]
    failurePolicy: Fail
    reinvocationPolicy: {{ .root.Values.sidecarInjectorWebhook.reinvocationPolicy | quote }}
    admissionReviewVersions: ["v1"]
{{- end }}
