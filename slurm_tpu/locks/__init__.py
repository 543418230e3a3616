"""Device ownership and leases: slot nodes, the lease ledger, ownership changes."""
