"""Energy accounting: interval grid, apportioning, carbon and cost, the ledger, chargeback."""
