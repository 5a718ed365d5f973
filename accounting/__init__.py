"""Energy accounting, the code of the accounting child process: the record link and journal,
work rows, the interval grid, apportioning, carbon and cost, the ledger, chargeback reports, the
child's supervision. Imports core and engines (the meters), never gateway."""
