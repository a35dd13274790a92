package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/tai42/sandbox"
)

func TestRelativeTime(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{9*time.Minute + 12*time.Second, "in 9m12s"},
		{9*time.Minute + 12*time.Second + 400*time.Millisecond, "in 9m12s"},
		{10 * time.Minute, "in 10m"},
		{45 * time.Second, "in 45s"},
		{2*time.Hour + 5*time.Minute + 30*time.Second, "in 2h5m"},
		{time.Hour, "in 1h"},
		{3*24*time.Hour + 4*time.Hour, "in 3d4h"},
		{200 * time.Millisecond, "now"},
		{-5 * time.Second, "5s ago"},
	} {
		if got := relativeTime(now.Add(tc.d), now); got != tc.want {
			t.Errorf("relativeTime(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

func TestFormatLabels(t *testing.T) {
	if got := formatLabels(map[string]string{"z": "1", "a": "x=y"}); got != "a=x=y,z=1" {
		t.Errorf("formatLabels = %q", got)
	}
	if got := formatLabels(nil); got != "-" {
		t.Errorf("formatLabels(nil) = %q", got)
	}
}

func TestSessionTable(t *testing.T) {
	now := time.Now()
	var b bytes.Buffer
	err := writeSessionTable(&b, []sandbox.SessionInfo{
		{ID: "sb-1", Image: "host", Durability: sandbox.Persistent, WorkspaceKey: "notes", ExpiresAt: now.Add(90 * time.Second)},
		{ID: "sb-2", Image: "host", Durability: sandbox.Ephemeral, ExpiresAt: now.Add(time.Hour), Labels: map[string]string{"k": "v"}},
	}, now)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"ID     IMAGE   DURABILITY   KEY     EXPIRES    LABELS",
		"sb-1   host    persistent   notes   in 1m30s   -",
		"sb-2   host    ephemeral    -       in 1h      k=v",
	}
	if got := strings.TrimRight(b.String(), "\n"); got != strings.Join(want, "\n") {
		t.Errorf("table:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
}

func TestOutputErr(t *testing.T) {
	if err := writeLines(&epipeWriter{}, "x"); errorExitCodeOf(err) != 141 {
		t.Errorf("EPIPE: %v", err)
	}
}

// errorExitCodeOf is the exit code an error returned by a command gives.
func errorExitCodeOf(err error) int {
	if ee, ok := err.(*exitError); ok {
		return ee.code
	}
	return errorExitCode(err)
}
