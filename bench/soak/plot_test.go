package main

import (
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestGlyphs(t *testing.T) {
	for r, g := range glyphs {
		rows := strings.Fields(g)
		if len(rows) != glyphH {
			t.Errorf("glyph %q: %d rows, want %d", r, len(rows), glyphH)
		}
		for _, row := range rows {
			if len(row) != glyphW || strings.Trim(row, "#.") != "" {
				t.Errorf("glyph %q: row %q is not %d cells of '#' or '.'", r, row, glyphW)
			}
		}
	}
	for _, r := range "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ .,-+=:()/%?" {
		if _, ok := glyphs[r]; !ok {
			t.Errorf("no glyph for %q", r)
		}
	}
	if got := glyph('ä'); strings.Join(got, " ") != glyphs['?'] {
		t.Errorf("a rune the font lacks is not drawn as '?': %q", got)
	}
	if got := glyph('m'); strings.Join(got, " ") != glyphs['M'] {
		t.Errorf("lowercase is not drawn as uppercase: %q", got)
	}
}

func TestDrawText(t *testing.T) {
	img := image.NewRGBA(image.Rect(0, 0, 40, 20))
	c := color.RGBA{255, 0, 0, 255}
	drawText(img, 1, 1, "1-", 2, c)
	// '1' row 0 is "..#..": cells 2 set, at scale 2 pixels x 5..6, y 1..2.
	for _, p := range []image.Point{{5, 1}, {6, 2}} {
		if img.RGBAAt(p.X, p.Y) != c {
			t.Errorf("pixel %v not set", p)
		}
	}
	if img.RGBAAt(1, 1) == c || img.RGBAAt(3, 1) == c {
		t.Error("an unset cell was drawn")
	}
	// '-' row 3 is "#####", the second glyph starts at 1 + 6×2.
	if img.RGBAAt(13, 1+3*2) != c || img.RGBAAt(13+9, 1+3*2+1) != c {
		t.Error("the second glyph is not where it should be")
	}
	if w := textWidth("1-", 2); w != 22 {
		t.Errorf("textWidth = %d, want 22", w)
	}
}

func TestNiceTicks(t *testing.T) {
	for _, tc := range []struct {
		lo, hi      float64
		step        float64
		first, last string
	}{
		{0, 30, 10, "0", "30"},
		{41.3, 78.9, 10, "40", "80"},
		{0.12, 0.57, 0.1, "0.1", "0.6"},
		{98, 102, 1, "98", "102"},
		{-3, 3, 2, "-4", "4"},
	} {
		tk := niceTicks(tc.lo, tc.hi)
		if math.Abs(tk.step-tc.step) > 1e-12 || tk.lo > tc.lo || tk.hi < tc.hi {
			t.Errorf("niceTicks(%v, %v): step %v, range %v..%v", tc.lo, tc.hi, tk.step, tk.lo, tk.hi)
			continue
		}
		if f, l := tk.format(tk.values[0]), tk.format(tk.values[len(tk.values)-1]); f != tc.first || l != tc.last {
			t.Errorf("niceTicks(%v, %v): ticks %s..%s, want %s..%s", tc.lo, tc.hi, f, l, tc.first, tc.last)
		}
		if n := len(tk.values); n < 3 || n > 12 {
			t.Errorf("niceTicks(%v, %v): %d ticks", tc.lo, tc.hi, n)
		}
	}
}

// TestPlot draws a growing and a flat series and checks the PNG: its size,
// the series' colour in every panel, the growing panel's red fit and
// verdict, the flat panel's green ones, a gap left for a NaN.
func TestPlot(t *testing.T) {
	ts, grow := series(60, func(i int) float64 { return 50 + float64(i) })
	_, flat := series(60, func(int) float64 { return 100 })
	flat[30] = math.NaN()
	_, fds := series(60, func(_ int) float64 { return 20 })
	panels := []panel{
		{title: "RSS (MIB)", y: grow, v: judge("rss", ts, grow, ruleRSS)},
		{title: "GOROUTINES", y: flat, v: judge("goroutines", ts, flat, ruleGoroutines)},
		{title: "OPEN FDS", y: fds, v: judge("fds", ts, fds, ruleFDs)},
	}
	if !panels[0].v.Growing || panels[1].v.Growing {
		t.Fatalf("verdicts: %s / %s", panels[0].v, panels[1].v)
	}
	path := filepath.Join(t.TempDir(), "soak.png")
	if err := writePNG(path, plot(ts, panels)); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != plotW || b.Dy() != 3*panelH+footerH {
		t.Fatalf("size %v", b)
	}
	count := func(top int, c color.RGBA) int {
		n := 0
		for y := top; y < top+panelH; y++ {
			for x := 0; x < plotW; x++ {
				if color.RGBAModel.Convert(img.At(x, y)).(color.RGBA) == c {
					n++
				}
			}
		}
		return n
	}
	for i := range panels {
		if n := count(i*panelH, colSeries); n < 200 {
			t.Errorf("panel %d: %d pixels of the series' colour", i, n)
		}
		if n := count(i*panelH, colText); n < 100 {
			t.Errorf("panel %d: %d pixels of text", i, n)
		}
	}
	if count(0, colFitGrowing) == 0 || count(0, colFitFlat) != 0 {
		t.Error("the growing panel is not drawn red")
	}
	if count(panelH, colFitFlat) == 0 || count(panelH, colFitGrowing) != 0 {
		t.Error("the flat panel is not drawn green")
	}
	// The NaN at t=300 s (of 590) leaves the series' line out around it:
	// the flat line at 100 is absent in the column there.
	x := marginLeft + int(math.Round(300.0/590*float64(plotW-marginLeft-marginRight)))
	for y := panelH + marginTop; y < 2*panelH-marginBottom; y++ {
		if color.RGBAModel.Convert(img.At(x, y)).(color.RGBA) == colSeries {
			t.Fatalf("the series is drawn across the missing sample (pixel %d,%d)", x, y)
		}
	}
}

// TestPlotDegenerate: no sample, one sample, all NaN: no panic, a picture.
func TestPlotDegenerate(t *testing.T) {
	for _, ts := range [][]float64{nil, {0}, {0, 10}} {
		y := make([]float64, len(ts))
		nan := make([]float64, len(ts))
		for i := range nan {
			nan[i] = math.NaN()
		}
		img := plot(ts, []panel{
			{title: "A", y: y, v: judge("a", ts, y, ruleRSS)},
			{title: "B", y: nan, v: judge("b", ts, nan, ruleRSS)},
		})
		if img.Bounds().Dx() != plotW {
			t.Errorf("%d samples: size %v", len(ts), img.Bounds())
		}
	}
}

// TestLine draws segments in every direction, steep and shallow: each
// ends, both ends are set, and a dashed one leaves gaps.
func TestLine(t *testing.T) {
	c := color.RGBA{1, 2, 3, 255}
	for _, end := range []image.Point{{40, 3}, {3, 40}, {-40, 3}, {-3, 40}, {40, -3}, {3, -40}, {-40, -3}, {-3, -40}, {0, 0}, {17, 17}, {0, -9}} {
		img := image.NewRGBA(image.Rect(0, 0, 101, 101))
		line(img, 50, 50, 50+end.X, 50+end.Y, 1, c, 0)
		if img.RGBAAt(50, 50) != c || img.RGBAAt(50+end.X, 50+end.Y) != c {
			t.Errorf("line to %v: an end is not set", end)
		}
		n := 0
		for y := range 101 {
			for x := range 101 {
				if img.RGBAAt(x, y) == c {
					n++
				}
			}
		}
		if want := max(abs(end.X), abs(end.Y)) + 1; n != want {
			t.Errorf("line to %v: %d pixels, want %d", end, n, want)
		}
	}
	img := image.NewRGBA(image.Rect(0, 0, 100, 10))
	line(img, 0, 5, 99, 5, 1, c, 4)
	if img.RGBAAt(0, 5) != c || img.RGBAAt(5, 5) == c || img.RGBAAt(8, 5) != c {
		t.Error("the dashes are not 4 on, 4 off")
	}
}
