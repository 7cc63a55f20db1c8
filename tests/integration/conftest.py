"""Integration tier: real processes killed with real signals, real SQLite files, local HTTP servers."""
