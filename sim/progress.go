package sim

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// progressBarWidth is the bar's length in characters: short enough for an 80-column
// terminal next to a run name and the counts.
const progressBarWidth = 30

// Progress reports how far a run is. On a terminal it redraws one line (a bar);
// otherwise, in a log or a pipe, it prints a plain line at most every 10% (and at the
// end), so the output stays short and readable after the fact.
//
// A Progress is not safe for concurrent use: the simulator's loop calls Step, and
// a concurrent replay calls it under its own lock.
// Write errors are ignored, because a closed terminal must not stop a bench whose
// results go to a file.
type Progress struct {
	w        io.Writer
	terminal bool
	now      func() time.Time

	run     string
	total   int
	done    int
	started time.Time
	active  bool
	// shown is the percentage last drawn (terminal) or the last 10% mark printed
	// (plain); -1 before the first.
	shown int
	line  strings.Builder
	// onStep, when set, gets every Step's count instead of a drawn line: an
	// engine process reports its requests to the bench that started it.
	onStep func(done int)
	// watch, when set, also sees every Step's count (Config.watch).
	watch func(done int)
}

// NewProgress returns a Progress that writes to w, redrawing a bar in place when
// terminal is true (see IsTerminal).
func NewProgress(w io.Writer, terminal bool) *Progress {
	return &Progress{w: w, terminal: terminal, now: time.Now, shown: -1}
}

// Start begins a run of total steps, finishing the previous run's line if it was not.
func (p *Progress) Start(run string, total int) {
	if p.active {
		p.Finish()
	}
	p.run, p.total, p.done = run, max(total, 0), 0
	p.started = p.now()
	p.active = true
	p.shown = -1
	if p.terminal {
		p.draw()
	}
}

// Step records that done steps of the current run are complete. done only grows;
// calls that do not move the shown percentage write nothing, so the simulator can call
// it once per request.
func (p *Progress) Step(done int) {
	if p.watch != nil {
		p.watch(done)
	}
	if p.onStep != nil {
		p.onStep(done)
		return
	}
	if !p.active || p.total == 0 {
		return
	}
	done = min(max(done, 0), p.total)
	p.done = done
	pct := p.percent()
	if p.terminal {
		if pct != p.shown {
			p.draw()
		}
		return
	}
	// The 100% line is Finish's, which adds the elapsed time.
	if mark := pct / 10 * 10; mark > p.shown && mark > 0 && mark < 100 {
		p.shown = mark
		p.printPlain("")
	}
}

// Finish completes the current run's line with its elapsed time. It does nothing when
// no run is active.
func (p *Progress) Finish() {
	if !p.active {
		return
	}
	p.active = false
	elapsed := " in " + p.now().Sub(p.started).Round(time.Millisecond).String()
	if p.terminal {
		p.draw()
		_, _ = io.WriteString(p.w, elapsed+"\n")
		return
	}
	p.printPlain(elapsed)
}

// Note prints one line of its own, finishing a run's line first.
func (p *Progress) Note(msg string) {
	if p.active && p.terminal {
		_, _ = io.WriteString(p.w, "\n")
	}
	_, _ = io.WriteString(p.w, msg+"\n")
	if p.active && p.terminal {
		p.draw()
	}
}

// percent is the integer percentage done; an empty run counts as complete.
func (p *Progress) percent() int {
	if p.total == 0 {
		return 100
	}
	return int(int64(p.done) * 100 / int64(p.total))
}

// draw redraws the terminal line: run name, bar, percentage and counts. The counts are
// padded to the width of the total so a redraw always covers the previous one.
func (p *Progress) draw() {
	pct := p.percent()
	p.shown = pct
	filled := pct * progressBarWidth / 100
	totalText := fmt.Sprint(p.total)
	p.line.Reset()
	p.line.WriteString("\r")
	p.line.WriteString(p.run)
	p.line.WriteString(" [")
	p.line.WriteString(strings.Repeat("=", filled))
	p.line.WriteString(strings.Repeat(" ", progressBarWidth-filled))
	fmt.Fprintf(&p.line, "] %3d%% (%*d/%s)", pct, len(totalText), p.done, totalText)
	_, _ = io.WriteString(p.w, p.line.String())
}

// printPlain prints one plain line, "run: 40% (120/300)", with suffix appended.
func (p *Progress) printPlain(suffix string) {
	_, _ = fmt.Fprintf(p.w, "%s: %d%% (%d/%d)%s\n", p.run, p.percent(), p.done, p.total, suffix)
}

// IsTerminal reports whether f is a terminal, which decides between a redrawn bar and
// plain lines.
func IsTerminal(f *os.File) bool {
	if f == nil {
		return false
	}
	// SyscallConn rather than Fd: Fd switches the file to blocking mode.
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	var termErr error
	if err := rc.Control(func(fd uintptr) {
		_, termErr = unix.IoctlGetTermios(int(fd), unix.TCGETS)
	}); err != nil {
		return false
	}
	return termErr == nil
}
