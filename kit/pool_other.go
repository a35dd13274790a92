//go:build !linux

package kit

func lowerThreadPriority() {}

func memInfo() (avail, total int64, ok bool) { return 0, 0, false }
