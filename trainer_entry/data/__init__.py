"""The child's training data: read, tokenized, cached and collated."""
