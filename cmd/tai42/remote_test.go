package main

import "testing"

func TestNormalizeURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:4242":  "http://127.0.0.1:4242",
		"https://example.com":    "https://example.com",
		"127.0.0.1:4242":         "http://127.0.0.1:4242",
		"localhost:4242":         "http://localhost:4242",
		"[::1]:4242":             "http://[::1]:4242",
		"unix:/run/tai42.sock":   "unix:/run/tai42.sock",
		"/run/tai42.sock":        "unix:/run/tai42.sock",
		"http://127.0.0.1:4242/": "http://127.0.0.1:4242/",
	} {
		if got, err := normalizeURL(in); err != nil || got != want {
			t.Errorf("normalizeURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"unix:", "ftp://host", "http://", "http://[::1"} {
		if got, err := normalizeURL(bad); err == nil {
			t.Errorf("normalizeURL(%q) = %q, want an error", bad, got)
		}
	}
}

func TestIsLocalURL(t *testing.T) {
	for u, want := range map[string]bool{
		"unix:/run/tai42.sock":   true,
		"http://127.0.0.1:4242":  true,
		"http://127.3.4.5:1":     true,
		"http://[::1]:4242":      true,
		"http://localhost:4242":  true,
		"https://10.0.0.1:4242":  false,
		"https://example.com":    false,
		"http://localhost.evil.": false,
	} {
		if got := isLocalURL(u); got != want {
			t.Errorf("isLocalURL(%q) = %v, want %v", u, got, want)
		}
	}
}
