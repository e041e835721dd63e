#!/usr/bin/env bash
# Stand-in for nvidia-smi's sampling mode in run.sh: four samples of
# "clocks.sm, power.draw", one unreadable line, then waits to be stopped.
printf '1980, 650.5\n1500, 700.0\n[N/A], [N/A]\n1980, 655.0\n1980, 690.0\n'
exec sleep 60
