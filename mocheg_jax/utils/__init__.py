"""Small helpers shared by every stage."""
