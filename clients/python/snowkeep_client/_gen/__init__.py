"""Generated code of snowkeep.v1 (see clients/python/generate); do not edit."""
