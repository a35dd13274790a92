package main

import (
	"math"
	"math/rand/v2"
	"testing"
)

// series returns n samples 10 s apart of f(i).
func series(n int, f func(i int) float64) (t, y []float64) {
	for i := range n {
		t = append(t, float64(i*10))
		y = append(y, f(i))
	}
	return t, y
}

func TestJudge(t *testing.T) {
	noise := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		name    string
		n       int
		f       func(i int) float64
		rule    Rule
		growing bool
		// tilted: the fitted rise alone exceeds the margin (the quarters
		// decide).
		tilted bool
	}{
		// 50 → 80 MiB over the run: a leak.
		{"rss growing", 180, func(i int) float64 { return 50 + 30*float64(i)/179 }, ruleRSS, true, false},
		// 100 → 160 goroutines: a rise of 48 over the judged samples, the
		// last quarter 24 over the second: both > max(13, 20).
		{"goroutines growing", 180, func(i int) float64 { return 100 + 60*float64(i)/179 }, ruleGoroutines, true, false},
		// For a steady trend the quarters' medians differ by half the
		// fitted rise: 100 → 140 rises 32 over the judged samples (> 20),
		// but the last quarter is only 16 over the second (< 20).
		{"slow goroutine growth", 180, func(i int) float64 { return 100 + 40*float64(i)/179 }, ruleGoroutines, false, true},
		// fds growing by 1 every 5 samples: 29 over the judged samples.
		{"fds growing in steps", 180, func(i int) float64 { return 40 + float64(i/5) }, ruleFDs, true, false},
		{"flat", 180, func(int) float64 { return 60 }, ruleRSS, false, false},
		// ±15% noise around 60 MiB, no trend.
		{"noisy flat", 180, func(int) float64 { return 60 * (1 + 0.3*(noise.Float64()-0.5)) }, ruleRSS, false, false},
		// Goroutines jumping between 150 and 250 at random.
		{"noisy flat goroutines", 180, func(int) float64 { return 150 + float64(noise.IntN(101)) }, ruleGoroutines, false, false},
		// A step up at 30% of the run (the second quarter after the warm-up
		// is already high), then flat: the line tilts, the quarters agree.
		{"step then flat", 180, func(i int) float64 {
			if i < 54 {
				return 40
			}
			return 70
		}, ruleRSS, false, true},
		// The same step inside the warm-up: nothing to see.
		{"step in the warm-up", 180, func(i int) float64 {
			if i < 20 {
				return 40
			}
			return 70
		}, ruleRSS, false, false},
		// Growth above 10% of the median but below the absolute floor.
		{"small growth under the floor", 180, func(i int) float64 { return 20 + 8*float64(i)/179 }, ruleFDs, false, false},
		// Growth above the floor but below 10% of a large median.
		{"small growth under 10%", 180, func(i int) float64 { return 1000 + 60*float64(i)/179 }, ruleRSS, false, false},
		// A late spike: the last quarter's median is still flat.
		{"one late spike", 180, func(i int) float64 {
			if i == 178 {
				return 500
			}
			return 60
		}, ruleRSS, false, true},
		// Short run, 1 s samples: still judged.
		{"short growing", 12, func(i int) float64 { return 100 + 10*float64(i) }, ruleGoroutines, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts, ys := series(tc.n, tc.f)
			v := judge(tc.name, ts, ys, tc.rule)
			if v.Insufficient || v.Growing != tc.growing {
				t.Errorf("growing %v (insufficient %v), want %v: %s", v.Growing, v.Insufficient, tc.growing, v)
			}
			if tc.tilted && !(v.Growth > v.Margin) {
				t.Errorf("the fitted rise %.1f is within the margin %.1f: the case does not test the quarters", v.Growth, v.Margin)
			}
			if v.Warmup != warmupCount(tc.n) || v.Judged != tc.n-v.Warmup {
				t.Errorf("warm-up %d, judged %d of %d", v.Warmup, v.Judged, tc.n)
			}
		})
	}
}

func TestJudgeNumbers(t *testing.T) {
	// y = 2t + 5 exactly: the fit finds it, the rise is over the judged
	// span (t from 200 to 990 s, after a warm-up of 20 of 100 samples).
	ts, ys := series(100, func(i int) float64 { return 2*float64(i*10) + 5 })
	v := judge("line", ts, ys, Rule{Rel: 0.1, Abs: 1})
	if v.Warmup != 20 || v.Judged != 80 {
		t.Fatalf("warm-up %d, judged %d", v.Warmup, v.Judged)
	}
	near := func(name string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	near("slope", v.Slope, 2)
	near("intercept", v.Intercept, 5)
	near("growth", v.Growth, 2*(990-200))
	near("median", v.Median, 2*(595)+5)         // samples 20..99: median of t is 595
	near("margin", v.Margin, 0.1*(2*595+5))     // 10% of the median beats Abs 1
	near("q2", v.Q2, 2*float64((40+59)*10/2)+5) // samples 40..59
	near("q4", v.Q4, 2*float64((80+99)*10/2)+5) // samples 80..99
	if !v.Growing {
		t.Errorf("not growing: %s", v)
	}
}

func TestJudgeInsufficient(t *testing.T) {
	// 10 samples: a warm-up of 3 leaves 7 < minJudged.
	ts, ys := series(10, func(i int) float64 { return float64(i * 100) })
	v := judge("short", ts, ys, ruleRSS)
	if !v.Insufficient || v.Growing || v.Warmup != 3 || v.Judged != 7 {
		t.Errorf("%+v", v)
	}
	// NaN samples are not counted: 20 samples, a warm-up of 4, then 5
	// numbers (at 6, 9, 12, 15, 18) among NaN.
	ts, ys = series(20, func(i int) float64 {
		if i%3 != 0 {
			return math.NaN()
		}
		return 5
	})
	v = judge("gaps", ts, ys, ruleRSS)
	if !v.Insufficient || v.Warmup != 4 || v.Judged != 5 {
		t.Errorf("%+v", v)
	}
	// No sample at all.
	v = judge("none", nil, nil, ruleRSS)
	if !v.Insufficient || v.Judged != 0 || v.Warmup != 0 {
		t.Errorf("%+v", v)
	}
}

func TestJudgeSkipsNaN(t *testing.T) {
	// A growing series with every third sample missing is still growing;
	// a flat one with gaps is still flat.
	gap := func(f func(i int) float64) func(int) float64 {
		return func(i int) float64 {
			if i%3 == 0 {
				return math.NaN()
			}
			return f(i)
		}
	}
	ts, ys := series(90, gap(func(i int) float64 { return 100 + float64(i) }))
	if v := judge("growing", ts, ys, ruleGoroutines); !v.Growing || v.Judged != 48 {
		t.Errorf("%s", v)
	}
	ts, ys = series(90, gap(func(int) float64 { return 100 }))
	if v := judge("flat", ts, ys, ruleGoroutines); v.Growing || v.Insufficient {
		t.Errorf("%s", v)
	}
}

func TestWarmupCount(t *testing.T) {
	for n, want := range map[int]int{0: 3, 1: 3, 12: 3, 15: 3, 16: 4, 20: 4, 21: 5, 180: 36} {
		if got := warmupCount(n); got != want {
			t.Errorf("warmupCount(%d) = %d, want %d", n, got, want)
		}
	}
}

func TestMedian(t *testing.T) {
	v := []float64{5, 1, 3}
	if m := median(v); m != 3 || v[0] != 5 {
		t.Errorf("median %v, input now %v", m, v)
	}
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("even median %v", m)
	}
	if !math.IsNaN(median(nil)) {
		t.Error("median of nothing is not NaN")
	}
}
