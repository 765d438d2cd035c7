"""The parity harness: scenarios, targets, observers, differ, ledger, reports."""
