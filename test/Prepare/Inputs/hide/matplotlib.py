# Stands in for a missing package: importing it fails as if not installed.
raise ImportError("No module named 'matplotlib'")
