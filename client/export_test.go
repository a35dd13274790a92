package client

import "github.com/tai42/sandbox"

// HandleDone is closed once the reader goroutine of h, an exec handle of
// this package, has finished and its connection is closed.
func HandleDone(h sandbox.ExecHandle) <-chan struct{} { return h.(*handle).done }
