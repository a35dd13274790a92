package sandbox

// PoolReporter is an optional interface of a [Sandbox] that keeps sessions
// ready ahead of the creates (a warm pool): a create whose spec matches a
// pooled shape is served by a session made earlier, indistinguishable from
// one made for it. The daemon's /metrics reports it. Like [ImageManager],
// it is found with a type assertion.
type PoolReporter interface {
	// PoolStats returns each pooled shape's figures, in the order the
	// shapes were configured. Safe for concurrent use.
	PoolStats() []PoolStats
}

// PoolStats are one pooled shape's figures since the sandbox started.
type PoolStats struct {
	// Image and Network are the shape: an ephemeral session of Image on
	// Network, at the provider's isolation.
	Image   string
	Network Network
	// Size is how many ready sessions the pool keeps of the shape; Ready
	// how many it holds now.
	Size, Ready int
	// Hits counts the creates of the shape served from the pool; Misses
	// those made cold because none was ready.
	Hits, Misses uint64
	// Refills counts the sessions made ahead, RefillSeconds the time their
	// creates took in all, and RefillFailures the creates that failed.
	Refills, RefillFailures uint64
	RefillSeconds           float64
	// Discarded counts the sessions made ahead and never handed out: dead
	// at their take, or flushed when their image was removed or replaced.
	Discarded uint64
}
