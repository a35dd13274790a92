package kit

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// lowerThreadPriority locks the calling goroutine to its thread and gives
// that thread the lowest CPU priority (nice 19) and the idle I/O class,
// best effort; the processes it starts inherit them. The thread ends with
// the goroutine (it stays locked), so no other goroutine runs on it.
func lowerThreadPriority() {
	runtime.LockOSThread()
	tid := syscall.Gettid()
	_ = syscall.Setpriority(syscall.PRIO_PROCESS, tid, 19)
	// ioprio_set(IOPRIO_WHO_PROCESS, tid, IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT)
	const ioprioWhoProcess, ioprioClassIdle, ioprioClassShift = 1, 3, 13
	_, _, _ = syscall.Syscall(syscall.SYS_IOPRIO_SET, ioprioWhoProcess, uintptr(tid), ioprioClassIdle<<ioprioClassShift)
}

// memInfo reads the machine's available and total memory, in bytes, from
// /proc/meminfo; ok is false when it cannot.
func memInfo() (avail, total int64, ok bool) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, _ := strings.Cut(sc.Text(), ":")
		var dst *int64
		switch name {
		case "MemAvailable":
			dst = &avail
		case "MemTotal":
			dst = &total
		default:
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0, 0, false
		}
		*dst = kb << 10
	}
	return avail, total, avail > 0 && total > 0
}
