"""Tests of bench/: the accuracy harness and the bounds script."""
