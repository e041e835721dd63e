"""Runs a command and prints its exit status last ('status: N'), so that a
test can pin the exact status; exits 0 itself."""
import subprocess
import sys

result = subprocess.run(sys.argv[1:])
sys.stdout.flush()
print(f"status: {result.returncode}", flush=True)
