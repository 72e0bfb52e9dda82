"""HTML reports and charts."""
