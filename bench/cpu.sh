# Shell helpers the CPU-per-byte benches share (sourced by efficiency.sh, loadgen_cpu.sh and ab_rate.sh).

CLK_TCK=$(getconf CLK_TCK)
# CPU seconds (user + system) a live process has used so far.
cpu_of() { awk -v t="$CLK_TCK" '{ sub(/^.*\) /, ""); print ($12 + $13) / t }' "/proc/$1/stat"; }
# Runs a command; prints the CPU seconds it (and its children) used on fd 3.
rusage() {
    python3 -c '
import resource, subprocess, sys
rc = subprocess.run(sys.argv[1:]).returncode
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(r.ru_utime + r.ru_stime, file=open("/dev/fd/3", "w"))
sys.exit(rc)' "$@"
}
