"""Performance benchmarks of deqlab against its peers (see benchmarks/README.md)."""
