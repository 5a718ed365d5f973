"""The ledger: one interface (base.Ledger), two stores (SQLite, PostgreSQL)."""
