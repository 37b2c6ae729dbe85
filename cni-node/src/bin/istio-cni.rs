//! istio-cni plugin binary (being built).

fn main() {
    eprintln!("istio-cni: the plugin is not built yet");
    std::process::exit(1);
}
