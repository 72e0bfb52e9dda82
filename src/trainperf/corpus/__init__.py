"""Labeled diagnosis corpus: trace surgery on real Kineto traces, corpus builder, `trainperf evaluate`."""
