"""Closed-loop evaluation and reports (filled by the closed-loop evaluation issue)."""
