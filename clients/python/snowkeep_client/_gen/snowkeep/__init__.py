"""snowkeep protos (generated)."""
