"""RACE's benchmark scripts (bench/README.md); ``bench.common`` holds what they share."""
