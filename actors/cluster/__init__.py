"""A household's cluster: certificates and token (pki), Ray's protections
(security), where actors go (placement), a helper node (join)."""
