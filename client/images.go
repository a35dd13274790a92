package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"

	"github.com/tai42/sandbox"
	"github.com/tai42/sandbox/api"
)

var _ sandbox.ImageManager = (*Client)(nil)

// maxPullLine bounds one line of the pull's answer (an event or its end:
// a few hundred bytes).
const maxPullLine = 1 << 20

// PullImage pulls ref into the daemon's store (POST /v1/images/pull),
// calling opts.Progress with each event of the daemon's stream, in order,
// from the calling goroutine (a "fetching" event the client had not read
// in time arrives merged into the next of its layer), and returns the
// image. A failed pull is an
// *sandbox.ImagePullError with its Reason (an invalid reference's is
// PullInvalidReference); a daemon whose provider keeps no images answers a
// *sandbox.SandboxError saying so. Ending ctx cancels the pull on the
// daemon (the connection closes); a stream that breaks before its outcome
// (a daemon that died) is a *sandbox.SandboxError saying the outcome is
// unknown.
func (c *Client) PullImage(ctx context.Context, ref string, opts sandbox.PullOptions) (sandbox.ImageInfo, error) {
	const op = "pull_image"
	b, err := json.Marshal(api.PullRequest{Ref: ref, Platform: opts.Platform})
	if err != nil {
		return sandbox.ImageInfo{}, sandbox.WrapError(op, "cannot encode the request", err)
	}
	resp, err := c.do(ctx, request{op: op, method: http.MethodPost, path: "/v1/images/pull", length: int64(len(b)),
		body: bytes.NewReader(b), contentType: "application/json", accept: api.ContentTypeNDJSON})
	if err != nil {
		return sandbox.ImageInfo{}, err
	}
	defer resp.Body.Close()
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != api.ContentTypeNDJSON {
		return sandbox.ImageInfo{}, sandbox.Errorf(op, "the daemon at %s answered the pull with %q, not the %s stream of its progress", c.display, mt, api.ContentTypeNDJSON)
	}
	return c.readPull(ctx, op, resp.Body, opts.Progress)
}

// pullLine is one line of the pull's answer: an event, or (Image or Error
// set) its end.
type pullLine struct {
	sandbox.PullProgress
	Image *sandbox.ImageInfo `json:"image"`
	Error *api.Error         `json:"error"`
}

// readPull reads the pull's lines up to its end, handing each event to
// progress.
func (c *Client) readPull(ctx context.Context, op string, body io.Reader, progress func(sandbox.PullProgress)) (sandbox.ImageInfo, error) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 4096), maxPullLine)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var l pullLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return sandbox.ImageInfo{}, sandbox.WrapError(op, "the daemon at "+c.display+" sent a line of the pull stream that is not the expected JSON", err)
		}
		switch {
		case l.Error != nil:
			return sandbox.ImageInfo{}, l.Error.Err()
		case l.Image != nil:
			return *l.Image, nil
		case progress != nil:
			progress(l.PullProgress)
		}
	}
	if err := ctx.Err(); err != nil {
		return sandbox.ImageInfo{}, ctxErr(op, err)
	}
	err := sc.Err()
	if err == nil {
		err = io.ErrUnexpectedEOF
	}
	return sandbox.ImageInfo{}, sandbox.WrapError(op, "the pull stream from the daemon at "+c.display+
		" ended before its outcome; whether the image was pulled is unknown (GET /v1/images says)", noEOF(err))
}

// ListImages returns the images the daemon holds, sorted by name (GET
// /v1/images); none for a provider that keeps no images.
func (c *Client) ListImages(ctx context.Context) ([]sandbox.ImageInfo, error) {
	var list api.ImageList
	if err := c.doJSON(ctx, "list_images", http.MethodGet, "/v1/images", nil, nil, &list); err != nil {
		return nil, err
	}
	if list.Images == nil {
		list.Images = []sandbox.ImageInfo{}
	}
	return list.Images, nil
}

// RemoveImage removes the daemon's image name (DELETE /v1/images/{name}),
// and the layers no other image uses. A name the daemon does not hold is a
// *sandbox.ImageNotFoundError; an image a live session uses is refused
// with a *sandbox.SandboxError saying so. An empty name is refused
// without a request.
func (c *Client) RemoveImage(ctx context.Context, name string) error {
	if name == "" {
		return sandbox.Errorf("remove_image", "an image name is required")
	}
	return c.doJSON(ctx, "remove_image", http.MethodDelete, imagePath(name), nil, nil, nil)
}

// PruneImages removes the layers no image uses (POST /v1/images/prune).
func (c *Client) PruneImages(ctx context.Context) (sandbox.PruneResult, error) {
	var res sandbox.PruneResult
	err := c.doJSON(ctx, "prune_images", http.MethodPost, "/v1/images/prune", nil, nil, &res)
	return res, err
}

// imagePath is /v1/images/{name...}: each '/'-separated part of the name
// escaped on its own, the '/' between them kept, as the route takes the
// rest of the path.
func imagePath(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return "/v1/images/" + strings.Join(parts, "/")
}
