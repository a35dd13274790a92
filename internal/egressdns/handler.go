package egressdns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// ServeDNS answers one query; miekg/dns calls it, one goroutine per query.
func (s *Server) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	_, tcp := w.LocalAddr().(*net.TCPAddr)
	sl, ctx, cancel := s.slots.acquire(s.ctx, clientOf(w))
	if sl == nil {
		s.overloaded.Add(1)
		s.reply(w, r, dns.RcodeServerFailure, nil)
		return
	}
	defer cancel()
	defer s.slots.release(sl)
	if r.Opcode != dns.OpcodeQuery {
		s.malformed.Add(1)
		s.reply(w, r, dns.RcodeNotImplemented, nil)
		return
	}
	if len(r.Question) != 1 {
		s.malformed.Add(1)
		s.reply(w, r, dns.RcodeFormatError, nil)
		return
	}
	q := r.Question[0]
	allow := s.allow.Load()
	if allow != nil && !allow.allows(q.Name) {
		s.refused.Add(1)
		s.log.Debug("egressdns: refused a name not in the allowlist",
			"name", q.Name, "type", dns.Type(q.Qtype).String(), "from", w.RemoteAddr().String())
		s.reply(w, r, dns.RcodeRefused, &dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeProhibited, ExtraText: "not in the egress domain allowlist"})
		return
	}

	resp, err := s.forward(ctx, r, tcp)
	if err != nil && sl.preempted.Load() {
		s.overloaded.Add(1)
		s.log.Debug("egressdns: a query gave its slot up to another client's", "name", q.Name, "type", dns.Type(q.Qtype).String(), "from", w.RemoteAddr().String())
		s.reply(w, r, dns.RcodeServerFailure, nil)
		return
	}
	if err != nil {
		s.upstreamFailures.Add(1)
		s.log.Debug("egressdns: no upstream answered", "name", q.Name, "type", dns.Type(q.Qtype).String(), "err", err)
		s.reply(w, r, dns.RcodeServerFailure, &dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeNoReachableAuthority})
		return
	}
	resp.Id = r.Id
	if tcp {
		resp.Compress = true
	} else {
		resp.Truncate(udpSize(r))
	}
	if allow != nil && s.onAnswer != nil && resp.Rcode == dns.RcodeSuccess && (q.Qtype == dns.TypeA || q.Qtype == dns.TypeAAAA) {
		// The addresses of what is sent, after truncation: a client never
		// has more to connect to.
		if addrs, ttl := answerAddrs(q.Name, q.Qtype, resp.Answer); len(addrs) > 0 {
			if err := s.report(addrs, keepFor(ttl, s.minTTL, s.grace)); err != nil {
				s.hookFailures.Add(1)
				s.log.Debug("egressdns: allowing the addresses of an answer failed", "name", q.Name, "type", dns.Type(q.Qtype).String(), "err", err)
				s.reply(w, r, dns.RcodeServerFailure, nil)
				return
			}
		}
	}
	s.forwarded.Add(1)
	s.write(w, resp)
}

// clientOf is the client a query is counted against: its source address.
func clientOf(w dns.ResponseWriter) netip.Addr {
	switch a := w.RemoteAddr().(type) {
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap()
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap()
	}
	// Not reached with miekg/dns's sockets; one shared client at worst.
	return netip.Addr{}
}

// report hands an answer's addresses to OnAnswer, within Timeout (a hook
// that hangs must not hold the query's slot for ever).
func (s *Server) report(addrs []netip.Addr, ttl time.Duration) error {
	ctx, cancel := context.WithTimeout(s.ctx, s.timeout)
	defer cancel()
	return s.onAnswer(ctx, addrs, ttl)
}

// reply answers r with rcode and no records; with an OPT (carrying ede,
// when given) if r had one.
func (s *Server) reply(w dns.ResponseWriter, r *dns.Msg, rcode int, ede *dns.EDNS0_EDE) {
	m := new(dns.Msg)
	m.SetRcode(r, rcode)
	m.RecursionAvailable = true
	if r.Opcode != dns.OpcodeQuery {
		m.Question = nil
	}
	if opt := r.IsEdns0(); opt != nil {
		o := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
		o.SetUDPSize(dns.DefaultMsgSize)
		if ede != nil {
			o.Option = append(o.Option, ede)
		}
		m.Extra = append(m.Extra, o)
	}
	s.write(w, m)
}

func (s *Server) write(w dns.ResponseWriter, m *dns.Msg) {
	if err := w.WriteMsg(m); err != nil {
		s.log.Debug("egressdns: cannot send an answer", "to", w.RemoteAddr().String(), "err", err)
	}
}

// udpSize is the largest UDP answer r's sender takes.
func udpSize(r *dns.Msg) int {
	if opt := r.IsEdns0(); opt != nil {
		return max(int(opt.UDPSize()), dns.MinMsgSize)
	}
	return dns.MinMsgSize
}

// forward asks the upstreams in turn for r's answer: over UDP, then TCP
// when the answer is truncated (and over TCP at once for a query that came
// over TCP). An answer with an rcode of SERVFAIL, REFUSED or NOTIMP sends
// it to the next upstream; the last such answer is returned when none gave
// a better one. It errs when no upstream answered at all.
func (s *Server) forward(ctx context.Context, r *dns.Msg, tcp bool) (*dns.Msg, error) {
	// A fresh ID upstream; r (and its ID) stays the client's. The copy is
	// shallow: packing does not change the sections.
	up := new(dns.Msg)
	*up = *r
	up.Id = dns.Id()
	var (
		last *dns.Msg
		errs []error
	)
	for _, addr := range s.upstreams {
		resp, err := s.exchange(ctx, up, addr, tcp)
		if err != nil {
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
			continue
		}
		switch resp.Rcode {
		case dns.RcodeServerFailure, dns.RcodeRefused, dns.RcodeNotImplemented:
			last = resp
			continue
		}
		return resp, nil
	}
	if last != nil {
		return last, nil
	}
	return nil, errors.Join(errs...)
}

// exchange asks one upstream.
func (s *Server) exchange(ctx context.Context, m *dns.Msg, addr string, tcp bool) (*dns.Msg, error) {
	if !tcp {
		resp, err := s.try(ctx, s.udpClient, m, addr)
		if err != nil || !resp.Truncated {
			return resp, err
		}
		full, err := s.try(ctx, s.tcpClient, m, addr)
		if err != nil {
			// The truncated answer is still an answer: the client may
			// ask again over TCP.
			s.log.Debug("egressdns: an upstream truncated an answer and TCP to it failed", "upstream", addr, "err", err)
			return resp, nil
		}
		return full, nil
	}
	return s.try(ctx, s.tcpClient, m, addr)
}

func (s *Server) try(ctx context.Context, c *dns.Client, m *dns.Msg, addr string) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	conn, err := c.DialContext(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", c.Net, addr, err)
	}
	defer conn.Close()
	// miekg/dns takes only ctx's deadline; a cancel (Close) must end the
	// exchange too. Closing, not a deadline, which the exchange would
	// overwrite were the cancel to come before it sets its own.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	resp, _, err := c.ExchangeWithConnContext(ctx, m, conn)
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return nil, fmt.Errorf("%s %s: %w", c.Net, addr, err)
	}
	// miekg/dns matches the ID only; an answer to another question is no
	// answer to this one.
	if len(resp.Question) != 1 || !strings.EqualFold(resp.Question[0].Name, m.Question[0].Name) ||
		resp.Question[0].Qtype != m.Question[0].Qtype || resp.Question[0].Qclass != m.Question[0].Qclass {
		return nil, fmt.Errorf("%s %s: the answer is for another question", c.Net, addr)
	}
	return resp, nil
}
