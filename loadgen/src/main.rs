//! `weir-loadgen` — throughput, latency and lag against any Kafka-compatible broker.

fn main() {
    println!("weir-loadgen {}", env!("CARGO_PKG_VERSION"));
}
