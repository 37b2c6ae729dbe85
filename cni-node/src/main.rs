//! cni-node agent binary (being built).

fn main() {
    eprintln!("cni-node: the node agent is not built yet");
    std::process::exit(1);
}
