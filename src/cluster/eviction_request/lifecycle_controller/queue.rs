//! The controller's queue: the pods to look at, the looks running, and what the loop's
//! inputs change in them.

use super::*;

/// What the controller's loop keeps between inputs.
#[derive(Default)]
pub(super) struct LoopState {
    memories: HashMap<Target, Memory>,
    /// When to look at which pods again.
    pub(super) timers: BTreeMap<Timestamp, BTreeSet<Target>>,
    backoff_cap: Option<Duration>,
    /// `drain.max_concurrent_requests` as last reloaded.
    pub(super) concurrency: Option<usize>,
    /// Pods to look at.
    dirty: BTreeSet<Target>,
    /// Pods being looked at (their memories are with the looks).
    looking: BTreeSet<Target>,
    /// Inputs about pods being looked at that change their memories: taken when the look
    /// ends.
    held: Vec<Input>,
}

impl LoopState {
    /// The next pod to look at that is not being looked at, with its memory.
    pub(super) fn next_look(&mut self) -> Option<(Target, Memory)> {
        let target = self
            .dirty
            .iter()
            .find(|t| !self.looking.contains(*t))
            .cloned()?;
        self.dirty.remove(&target);
        self.looking.insert(target.clone());
        let mut memory = self.memories.remove(&target).unwrap_or_default();
        memory.backoff_cap = self.backoff_cap;
        Some((target, memory))
    }
}

impl LifecycleController {
    /// A look ended: its memory kept, its wakes set, the inputs held for it taken.
    fn looked(
        &self,
        target: Target,
        mut memory: Memory,
        caches: &Caches,
        state: &mut LoopState,
    ) -> Result<()> {
        state.looking.remove(&target);
        for at in memory.wakes.drain(..) {
            state.timers.entry(at).or_default().insert(target.clone());
        }
        if !memory.is_idle() {
            state.memories.insert(target.clone(), memory);
        }
        let (mine, others) = std::mem::take(&mut state.held)
            .into_iter()
            .partition(|i| changes_memory_of(i).as_ref() == Some(&target));
        state.held = others;
        for input in mine {
            self.take_input(input, caches, state)?;
        }
        Ok(())
    }

    /// Which pods an input calls for a look at.
    pub(super) fn take_input(
        &self,
        input: Input,
        caches: &Caches,
        state: &mut LoopState,
    ) -> Result<()> {
        if changes_memory_of(&input).is_some_and(|t| state.looking.contains(&t)) {
            state.held.push(input);
            return Ok(());
        }
        let dirty = &mut state.dirty;
        match input {
            Input::Looked(target, memory) => return self.looked(target, *memory, caches, state),
            Input::Watched(Some(Ok(event))) => match *event {
                watcher::Event::Delete(o) => {
                    let key = object_key(&o.metadata);
                    if let Some(m) = target_of(&o).and_then(|t| state.memories.get_mut(&t)) {
                        m.written.remove(&key);
                        m.requested.remove(&key);
                    }
                    dirty.extend(target_of(&o));
                }
                watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                    dirty.extend(target_of(&o));
                }
                _ => {}
            },
            Input::Watched(Some(Err(err))) => {
                match crate::cluster::gateway::unusable_watch_event(&err) {
                    Some(what) => {
                        warn!(node = %self.node, error = %err, "lifecycle.nodegrace.dev: {what}")
                    }
                    None => debug!(error = %err, "watching lifecycle.nodegrace.dev"),
                }
            }
            Input::Watched(None) => {
                anyhow::bail!("the lifecycle.nodegrace.dev watches ended")
            }
            Input::Told(Some(Message::PodChanged { namespace, uid })) => {
                let name = self
                    .pod_name(&namespace, &uid)
                    .or_else(|| requested_name(caches, &namespace, &uid));
                dirty.extend(name.map(|n| (namespace, n)));
            }
            Input::Told(Some(Message::LifecycleRequested(request))) => {
                let key = object_key(&request.metadata);
                let target = request.spec.target.pod.as_ref().map(|p| p.name.clone());
                if let (Some(ns), Some(name)) = (request.metadata.namespace.clone(), target) {
                    let target = (ns, name);
                    state
                        .memories
                        .entry(target.clone())
                        .or_default()
                        .requested
                        .insert(key, self.written(*request));
                    dirty.insert(target);
                }
            }
            Input::Told(Some(Message::BackoffMax(cap))) => {
                state.backoff_cap = Some(cap);
                dirty.extend(all_targets(caches));
            }
            Input::Told(Some(Message::Concurrency(n))) => state.concurrency = Some(n),
            Input::Told(None) => {}
            Input::Timer => {
                let now = self.clock.now();
                let later = state
                    .timers
                    .split_off(&now.checked_add(Duration::from_millis(1)).unwrap_or(now));
                for (_, due) in std::mem::replace(&mut state.timers, later) {
                    dirty.extend(due);
                }
            }
        }
        Ok(())
    }
}

pub(super) type WatchItem = Result<watcher::Event<DynamicObject>, watcher::Error>;

/// What woke the controller's loop.
pub(super) enum Input {
    Watched(Option<Result<Box<watcher::Event<DynamicObject>>, watcher::Error>>),
    Told(Option<Message>),
    Timer,
    /// A look at the pod ended.
    Looked(Target, Box<Memory>),
}

/// The pod whose memory `input` changes.
fn changes_memory_of(input: &Input) -> Option<Target> {
    match input {
        Input::Watched(Some(Ok(event))) => match &**event {
            watcher::Event::Delete(o) => target_of(o),
            _ => None,
        },
        Input::Told(Some(Message::LifecycleRequested(request))) => Some((
            request.metadata.namespace.clone()?,
            request.spec.target.pod.as_ref()?.name.clone(),
        )),
        _ => None,
    }
}
