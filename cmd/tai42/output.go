package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"syscall"
	"time"
)

// writeJSON writes v to w as indented JSON and a newline.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return outputErr(enc.Encode(v))
}

// writeLines writes each line to w, newline-terminated.
func writeLines(w io.Writer, lines ...string) error {
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return outputErr(err)
}

// outputErr maps an error writing tai42's own output to its exit: 141 (as
// if killed by SIGPIPE) and no message for a closed pipe ("tai42 ls |
// head -1"), else exit 1 naming the failure.
func outputErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.EPIPE):
		return &exitError{code: signalExit(syscall.SIGPIPE)}
	}
	return &exitError{code: exitFailure, err: fmt.Errorf("writing the output: %w", err)}
}

// relativeTime says when t is, seen from now, to the second: "in 9m12s",
// "in 2h5m", "in 3d4h", "now", or "5s ago".
func relativeTime(t, now time.Time) string {
	d := t.Sub(now).Round(time.Second)
	switch {
	case d == 0:
		return "now"
	case d < 0:
		return compactDuration(-d) + " ago"
	}
	return "in " + compactDuration(d)
}

// compactDuration prints a positive duration with its two largest units:
// "45s", "9m12s", "2h5m", "3d4h". Zero lower units are left out ("1h").
func compactDuration(d time.Duration) string {
	d = d.Round(time.Second)
	units := []struct {
		n    time.Duration
		name string
	}{{24 * time.Hour, "d"}, {time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}}
	for i, u := range units {
		if d < u.n && i < len(units)-1 {
			continue
		}
		s := fmt.Sprintf("%d%s", d/u.n, u.name)
		if i+1 < len(units) {
			if rest := (d % u.n) / units[i+1].n; rest > 0 {
				s += fmt.Sprintf("%d%s", rest, units[i+1].name)
			}
		}
		return s
	}
	return "0s"
}

// formatLabels prints labels sorted by key as "k=v,k2=v2", "-" for none.
func formatLabels(labels map[string]string) string {
	if len(labels) == 0 {
		return "-"
	}
	keys := slices.Sorted(maps.Keys(labels))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + labels[k]
	}
	return strings.Join(parts, ",")
}

// orDash prints "-" for an empty cell.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
