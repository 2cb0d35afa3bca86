"""Third-party generated code kept as is (see the header of each file)."""
