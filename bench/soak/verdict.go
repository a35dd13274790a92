package main

import (
	"fmt"
	"math"
	"slices"
)

// Rule is the growth a series may show before it counts as growing: the
// margin is the larger of Rel × the series' median and Abs (in the series'
// unit), so that both must be exceeded.
type Rule struct {
	Rel float64
	Abs float64
}

// The rules of the three judged series (the thresholds).
var (
	ruleRSS        = Rule{Rel: 0.10, Abs: 8}  // MiB
	ruleGoroutines = Rule{Rel: 0.10, Abs: 20} // goroutines
	ruleFDs        = Rule{Rel: 0.10, Abs: 10} // open file descriptors
)

// minJudged is the fewest samples, after the warm-up, that a series is
// judged on: two to a quarter.
const minJudged = 8

// Verdict is the outcome of [judge] for one series, with the numbers it was
// decided on.
type Verdict struct {
	Series string
	// Warmup is how many leading samples were left out; Judged how many
	// were used (missing samples, NaN, are counted in neither).
	Warmup, Judged int
	// Median is the judged samples' median; Margin the rule's allowance,
	// max(Rel × Median, Abs).
	Median, Margin float64
	// Slope is the least-squares slope per second; Growth that slope over
	// the judged samples' time span.
	Slope, Growth float64
	// Intercept is the fitted line's value at time 0 (for the plot).
	Intercept float64
	// Q2 and Q4 are the medians of the judged samples' second and last
	// quarters.
	Q2, Q4 float64
	// Insufficient reports fewer than minJudged samples to judge on: the
	// series was not judged and Growing is false.
	Insufficient bool
	// Growing reports that Growth and Q4 − Q2 both exceed Margin.
	Growing bool
}

// warmupCount is how many leading samples of n the warm-up takes: the first
// 20%, at least 3.
func warmupCount(n int) int {
	return max(3, (n+4)/5)
}

// judge decides whether the series y, sampled at times t (seconds, in
// increasing order, len(t) == len(y)), keeps growing under rule r. The
// first warmupCount(len(y)) samples are left out, then NaN samples; on what
// is left a least-squares line is fitted. The series is growing when the
// line's rise over the judged span exceeds the margin (max(r.Rel × median,
// r.Abs)) and the last quarter's median exceeds the second quarter's by
// more than the margin too: a slope alone is not enough (a step early in
// the run, then flat, tilts the line), nor is a late spike alone. judge
// panics when t and y differ in length.
func judge(name string, t, y []float64, r Rule) Verdict {
	if len(t) != len(y) {
		panic(fmt.Sprintf("judge %s: %d times but %d values", name, len(t), len(y)))
	}
	v := Verdict{Series: name, Warmup: min(warmupCount(len(y)), len(y))}
	var ts, ys []float64
	for i := v.Warmup; i < len(y); i++ {
		if !math.IsNaN(y[i]) {
			ts = append(ts, t[i])
			ys = append(ys, y[i])
		}
	}
	v.Judged = len(ys)
	if v.Judged < minJudged {
		v.Insufficient = true
		if v.Judged > 0 {
			v.Median = median(ys)
		}
		return v
	}
	v.Median = median(ys)
	v.Margin = max(r.Rel*math.Abs(v.Median), r.Abs)
	v.Slope, v.Intercept = fitLine(ts, ys)
	v.Growth = v.Slope * (ts[len(ts)-1] - ts[0])
	n := len(ys)
	v.Q2 = median(ys[n/4 : n/2])
	v.Q4 = median(ys[3*n/4:])
	v.Growing = v.Growth > v.Margin && v.Q4-v.Q2 > v.Margin
	return v
}

// fitLine returns the least-squares line y = slope × t + intercept. Equal
// times give slope 0 and the mean as intercept.
func fitLine(t, y []float64) (slope, intercept float64) {
	n := float64(len(t))
	var mt, my float64
	for i := range t {
		mt += t[i]
		my += y[i]
	}
	mt /= n
	my /= n
	var sxy, sxx float64
	for i := range t {
		dt := t[i] - mt
		sxy += dt * (y[i] - my)
		sxx += dt * dt
	}
	if sxx == 0 {
		return 0, my
	}
	slope = sxy / sxx
	return slope, my - slope*mt
}

// median returns the median of v (v is not changed); NaN for none.
func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// String is the verdict's line in the report.
func (v Verdict) String() string {
	if v.Insufficient {
		return fmt.Sprintf("%-10s NOT JUDGED: %d samples after a warm-up of %d, at least %d needed (run longer or use a shorter -interval)",
			v.Series, v.Judged, v.Warmup, minJudged)
	}
	word := "flat"
	if v.Growing {
		word = "GROWING"
	}
	return fmt.Sprintf("%-10s %-7s  median %s, margin %s; fitted rise over the judged span %s (%s/min); 2nd-quarter median %s, last-quarter %s (%s); %d samples after %d of warm-up",
		v.Series, word, num(v.Median), num(v.Margin), signed(v.Growth), signed(v.Slope*60),
		num(v.Q2), num(v.Q4), signed(v.Q4-v.Q2), v.Judged, v.Warmup)
}

func num(f float64) string    { return fmt.Sprintf("%.1f", f) }
func signed(f float64) string { return fmt.Sprintf("%+.1f", f) }
