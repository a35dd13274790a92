package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
)

// Plot geometry, in pixels.
const (
	plotW        = 1000
	panelH       = 250
	marginLeft   = 96
	marginRight  = 24
	marginTop    = 34
	marginBottom = 30
	footerH      = 28
	textScale    = 2
)

// Plot colours.
var (
	colBackground = color.RGBA{255, 255, 255, 255}
	colWarmup     = color.RGBA{238, 238, 238, 255}
	colGrid       = color.RGBA{220, 220, 220, 255}
	colFrame      = color.RGBA{110, 110, 110, 255}
	colText       = color.RGBA{20, 20, 20, 255}
	colSeries     = color.RGBA{31, 90, 200, 255}
	colFitFlat    = color.RGBA{30, 140, 60, 255}
	colFitGrowing = color.RGBA{200, 30, 30, 255}
)

// panel is one series of the plot.
type panel struct {
	title string // "RSS (MIB)"
	y     []float64
	v     Verdict
}

// plot draws one panel per series over the times t (seconds): the series,
// its warm-up shaded, the fitted line over the judged samples (green when
// flat, red when growing) and the verdict in the title. NaN values are
// gaps. Every panel's y must be as long as t.
func plot(t []float64, panels []panel) *image.RGBA {
	h := len(panels)*panelH + footerH
	img := image.NewRGBA(image.Rect(0, 0, plotW, h))
	draw.Draw(img, img.Bounds(), image.NewUniform(colBackground), image.Point{}, draw.Src)
	span := 1.0
	if len(t) > 0 && t[len(t)-1] > 0 {
		span = t[len(t)-1]
	}
	unit, div := "S", 1.0
	if span >= 600 {
		unit, div = "MIN", 60
	}
	xt := niceTicks(0, span/div)
	for i, p := range panels {
		drawPanel(img, i*panelH, t, p, span, div, xt)
	}
	label := "TIME (" + unit + ")"
	drawText(img, (plotW-textWidth(label, textScale))/2, h-footerH+(footerH-textHeight(textScale))/2, label, textScale, colText)
	return img
}

func drawPanel(img *image.RGBA, top int, t []float64, p panel, span, div float64, xt ticks) {
	x0, x1 := marginLeft, plotW-marginRight
	y0, y1 := top+marginTop, top+panelH-marginBottom
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, v := range p.y {
		if !math.IsNaN(v) {
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
	}
	fit := !p.v.Insufficient && p.v.Warmup < len(t)
	var fa, fb float64 // the fitted line's ends, at t[Warmup] and the last t
	if fit {
		fa = p.v.Slope*t[p.v.Warmup] + p.v.Intercept
		fb = p.v.Slope*t[len(t)-1] + p.v.Intercept
		lo, hi = math.Min(lo, math.Min(fa, fb)), math.Max(hi, math.Max(fa, fb))
	}
	if math.IsInf(lo, 0) { // no value at all
		lo, hi = 0, 1
	}
	if hi-lo < 1e-9 {
		lo, hi = lo-1, hi+1
	}
	pad := (hi - lo) * 0.05
	bottom := lo - pad
	if lo >= 0 {
		bottom = math.Max(bottom, 0) // counts and sizes: no negative axis
	}
	yt := niceTicks(bottom, hi+pad)
	lo, hi = yt.lo, yt.hi
	px := func(tv float64) int { return x0 + int(math.Round(tv/span*float64(x1-x0))) }
	py := func(v float64) int { return y1 - int(math.Round((v-lo)/(hi-lo)*float64(y1-y0))) }

	if p.v.Warmup > 0 && len(t) > 0 {
		end := t[min(p.v.Warmup, len(t)-1)]
		fillRect(img, x0, y0, px(end), y1, colWarmup)
	}
	for _, v := range yt.values {
		y := py(v)
		hline(img, x0, x1, y, colGrid)
		s := yt.format(v)
		drawText(img, x0-8-textWidth(s, textScale), y-textHeight(textScale)/2, s, textScale, colText)
	}
	for _, v := range xt.values {
		x := px(v * div)
		vline(img, x, y0, y1, colGrid)
		s := xt.format(v)
		drawText(img, x-textWidth(s, textScale)/2, y1+8, s, textScale, colText)
	}
	hline(img, x0, x1, y0, colFrame)
	hline(img, x0, x1, y1, colFrame)
	vline(img, x0, y0, y1, colFrame)
	vline(img, x1, y0, y1, colFrame)

	for i := 1; i < len(t); i++ {
		if math.IsNaN(p.y[i-1]) || math.IsNaN(p.y[i]) {
			continue
		}
		line(img, px(t[i-1]), py(p.y[i-1]), px(t[i]), py(p.y[i]), 2, colSeries, 0)
	}
	if len(t) == 1 && !math.IsNaN(p.y[0]) {
		line(img, px(t[0]), py(p.y[0]), px(t[0]), py(p.y[0]), 3, colSeries, 0)
	}
	title := p.title + ": "
	verdict, vc := "NOT JUDGED", colText
	switch {
	case p.v.Insufficient:
	case p.v.Growing:
		verdict, vc = "GROWING", colFitGrowing
	default:
		verdict, vc = "FLAT", colFitFlat
	}
	if fit {
		line(img, px(t[p.v.Warmup]), py(fa), px(t[len(t)-1]), py(fb), 2, vc, 8)
		verdict += fmt.Sprintf("  (FIT %+.1f OVER THE RUN, MARGIN %.1f)", p.v.Growth, p.v.Margin)
	}
	ty := top + (marginTop-textHeight(textScale))/2
	drawText(img, x0, ty, title, textScale, colText)
	drawText(img, x0+textWidth(title, textScale)+textScale, ty, verdict, textScale, vc)
}

func fillRect(img *image.RGBA, xa, ya, xb, yb int, c color.RGBA) {
	draw.Draw(img, image.Rect(xa, ya, xb, yb), image.NewUniform(c), image.Point{}, draw.Src)
}

func hline(img *image.RGBA, xa, xb, y int, c color.RGBA) {
	for x := xa; x <= xb; x++ {
		img.SetRGBA(x, y, c)
	}
}

func vline(img *image.RGBA, x, ya, yb int, c color.RGBA) {
	for y := ya; y <= yb; y++ {
		img.SetRGBA(x, y, c)
	}
}

// line draws from (xa, ya) to (xb, yb) with square dots of width w;
// dash > 0 draws dash pixels, then leaves dash pixels out, in turn.
func line(img *image.RGBA, xa, ya, xb, yb, w int, c color.RGBA, dash int) {
	dx, dy := abs(xb-xa), -abs(yb-ya)
	sx, sy := sign(xb-xa), sign(yb-ya)
	e := dx + dy
	for n := 0; ; n++ {
		if dash == 0 || (n/dash)%2 == 0 {
			for i := range w {
				for j := range w {
					img.SetRGBA(xa+i-w/2, ya+j-w/2, c)
				}
			}
		}
		if xa == xb && ya == yb {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			xa += sx
		}
		if e2 <= dx {
			e += dx
			ya += sy
		}
	}
}

func abs(a int) int {
	if a < 0 {
		return -a
	}
	return a
}

func sign(a int) int {
	switch {
	case a < 0:
		return -1
	case a > 0:
		return 1
	}
	return 0
}

// ticks are an axis's range, widened to whole steps, and its tick values.
type ticks struct {
	lo, hi, step float64
	values       []float64
	decimals     int
}

// niceTicks returns about five ticks at a step of 1, 2 or 5 × 10^k that
// cover [lo, hi] (lo < hi).
func niceTicks(lo, hi float64) ticks {
	if !(hi > lo) {
		hi = lo + 1
	}
	raw := (hi - lo) / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := 10 * mag
	for _, m := range []float64{1, 2, 5} {
		if raw <= m*mag {
			step = m * mag
			break
		}
	}
	tk := ticks{lo: math.Floor(lo/step) * step, hi: math.Ceil(hi/step) * step, step: step}
	if step < 1 {
		tk.decimals = int(math.Ceil(-math.Log10(step) - 1e-9))
	}
	for i := 0; ; i++ {
		v := tk.lo + float64(i)*step
		if v > tk.hi+step/2 {
			break
		}
		tk.values = append(tk.values, v)
	}
	return tk
}

func (tk ticks) format(v float64) string {
	if math.Abs(v) < tk.step/2 {
		v = 0 // no "-0"
	}
	return fmt.Sprintf("%.*f", tk.decimals, v)
}

// writePNG writes img to path as a PNG.
func writePNG(path string, img image.Image) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return fmt.Errorf("encoding %s: %w", path, err)
	}
	return f.Close()
}
