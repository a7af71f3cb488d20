package bench

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// schedTimes is the CPU time and the run-queue wait (time runnable but not
// running: waiting for a core) of every thread of process pid, in
// nanoseconds, from /proc/<pid>/task/*/schedstat (Linux; zeros elsewhere
// or when the process is gone). pid 0 is this process.
func schedTimes(pid int) (cpu, wait float64) {
	dir := "/proc/self/task"
	if pid > 0 {
		dir = "/proc/" + strconv.Itoa(pid) + "/task"
	}
	tasks, _ := filepath.Glob(dir + "/*/schedstat")
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			continue
		}
		c, _ := strconv.ParseFloat(f[0], 64)
		w, _ := strconv.ParseFloat(f[1], 64)
		cpu += c
		wait += w
	}
	return cpu, wait
}

// servicePIDs are the process ids of the broker and of Redis, read from
// IDEMQ_BENCH_BEAM_PID and IDEMQ_BENCH_REDIS_PID (0 when unset): with
// them, each case also reports their CPU and run-queue wait per message.
func servicePIDs() (beam, redis int) {
	beam, _ = strconv.Atoi(os.Getenv("IDEMQ_BENCH_BEAM_PID"))
	redis, _ = strconv.Atoi(os.Getenv("IDEMQ_BENCH_REDIS_PID"))
	return beam, redis
}
