package host

import "github.com/tai42/sandbox/kit"

// FailCreateSteps has every create of the host runner of sb ask fail
// before each of its steps, with the session's id and the step's name: an
// error fail returns fails that step (the steps before it are undone as on
// any failure); nil lets it run. nil turns it off. Set it while no create
// runs.
func FailCreateSteps(sb *kit.Sandbox, fail func(id, step string) error) {
	sb.Provider().(*provider).faults = fail
}

// TrackingGroup is the tracking cgroup's directory of session id under the
// runner of sb; "" where the runner tracks no processes.
func TrackingGroup(sb *kit.Sandbox, id string) string {
	p := sb.Provider().(*provider)
	if p.track == nil {
		return ""
	}
	return p.track.parent + "/" + id
}
