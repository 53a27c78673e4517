"""Generated markdown reports (from real GPU runs) and the code that renders them."""
