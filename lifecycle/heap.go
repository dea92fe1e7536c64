package lifecycle

// timerHeap is an indexed binary min-heap of domains ordered by deadline
// (ties by insertion sequence, for determinism). Each domain is in it at
// most once (domain.hidx >= 0), so its size never exceeds the number of
// tracked domains, and a domain can be removed in O(log n) when its stop
// is cancelled.
type timerHeap struct {
	items []*domain
	seq   uint64
}

func (h *timerHeap) len() int { return len(h.items) }

func (h *timerHeap) less(i, j int) bool {
	a, b := h.items[i], h.items[j]
	if !a.deadline.Equal(b.deadline) {
		return a.deadline.Before(b.deadline)
	}
	return a.seq < b.seq
}

func (h *timerHeap) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].hidx = i
	h.items[j].hidx = j
}

func (h *timerHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h *timerHeap) down(i int) {
	n := len(h.items)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && h.less(r, l) {
			m = r
		}
		if !h.less(m, i) {
			return
		}
		h.swap(i, m)
		i = m
	}
}

// push adds d, which must not be in the heap; d.deadline must be set.
func (h *timerHeap) push(d *domain) {
	h.seq++
	d.seq = h.seq
	d.hidx = len(h.items)
	h.items = append(h.items, d)
	h.up(d.hidx)
}

// top returns the earliest domain; the heap must not be empty.
func (h *timerHeap) top() *domain { return h.items[0] }

// remove takes d out of the heap if it is in it.
func (h *timerHeap) remove(d *domain) {
	i := d.hidx
	if i < 0 {
		return
	}
	last := len(h.items) - 1
	if i != last {
		h.swap(i, last)
	}
	h.items[last] = nil
	h.items = h.items[:last]
	d.hidx = -1
	if i < last {
		h.down(i)
		h.up(i)
	}
}

// fix restores the order after d.deadline changed; d must be in the heap.
func (h *timerHeap) fix(d *domain) {
	h.down(d.hidx)
	h.up(d.hidx)
}
