"""snowkeep.v1 protos (generated)."""
