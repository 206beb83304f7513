package plugin

import (
	"container/list"
	"sync"

	"github.com/containerd/nri/pkg/api"
)

// maxRequests bounds the requests kept between CreateContainer and the
// validation: far more containers than a node creates at once, and the
// oldest go first, as a creation whose validation never came (another
// plugin refused it) leaves its request behind.
const maxRequests = 1024

// requests keeps each container's request from its CreateContainer until
// its validation takes it, by container ID.
type requests struct {
	mu    sync.Mutex
	byID  map[string]*list.Element
	order list.List // of *kept, oldest first
}

type kept struct {
	id string
	r  *request
}

// put keeps r for container id, dropping the oldest beyond maxRequests.
func (q *requests) put(id string, r *request) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.byID == nil {
		q.byID = map[string]*list.Element{}
	}
	if e, ok := q.byID[id]; ok {
		q.order.Remove(e)
	}
	q.byID[id] = q.order.PushBack(&kept{id: id, r: r})
	for q.order.Len() > maxRequests {
		q.remove(q.order.Front())
	}
}

// take returns and forgets the request kept for ctr, nil when there is
// none or it was built for another pod (a sandbox or pod UID that is not
// pod's, another container name).
func (q *requests) take(pod *api.PodSandbox, ctr *api.Container) *request {
	q.mu.Lock()
	defer q.mu.Unlock()
	e, ok := q.byID[ctr.GetId()]
	if !ok {
		return nil
	}
	r := q.remove(e)
	if r.podUID != pod.GetUid() || r.sandbox != pod.GetId() || r.ctr != ctr.GetName() {
		return nil
	}
	return r
}

// drop forgets the request of container id.
func (q *requests) drop(id string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if e, ok := q.byID[id]; ok {
		q.remove(e)
	}
}

// dropPod forgets the requests of pod's containers.
func (q *requests) dropPod(pod *api.PodSandbox) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for e := q.order.Front(); e != nil; {
		next := e.Next()
		if e.Value.(*kept).r.sandbox == pod.GetId() {
			q.remove(e)
		}
		e = next
	}
}

// reset forgets every request: a new connection's validations follow its
// own CreateContainer calls.
func (q *requests) reset() {
	q.mu.Lock()
	defer q.mu.Unlock()
	clear(q.byID)
	q.order.Init()
}

func (q *requests) remove(e *list.Element) *request {
	k := q.order.Remove(e).(*kept)
	delete(q.byID, k.id)
	return k.r
}
