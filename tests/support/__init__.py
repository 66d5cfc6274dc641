"""What the tests share: job launching, fakes, references (tests/README.md)."""
