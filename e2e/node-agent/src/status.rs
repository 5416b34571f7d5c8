//! The agent's in-memory record of a Pod's containers and its rendering into a Pod `status`.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, HostIP, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// A container's current state.
#[derive(Debug, Clone, PartialEq)]
pub enum CState {
    /// Not running yet, or between restarts.
    Waiting {
        /// Machine-readable cause (e.g. "ContainerCreating", "CrashLoopBackOff").
        reason: String,
        /// What a human should know about it.
        message: String,
    },
    /// The process runs.
    Running {
        /// When it was started.
        started_at: Time,
    },
    /// The process exited; this is how.
    Terminated(Terminated),
}

/// A finished run of a container.
#[derive(Debug, Clone, PartialEq)]
pub struct Terminated {
    /// Process exit status (128 + signal number when killed by one, -1 when unknown).
    pub exit_code: i32,
    /// "Completed" for exit code 0, else "Error" (as the kubelet says).
    pub reason: String,
    /// When the process started, if it did.
    pub started_at: Option<Time>,
    /// When the agent saw it exit.
    pub finished_at: Time,
}

/// What the agent knows about one container.
#[derive(Debug, Clone)]
pub struct ContainerRecord {
    /// Container name in the Pod spec.
    pub name: String,
    /// Image named in the Pod spec (reported as is; the host binary stands for it).
    pub image: String,
    /// Restarts after the first start.
    pub restart_count: i32,
    /// The current run's state.
    pub state: CState,
    /// The previous run, shown as lastState.
    pub last: Option<Terminated>,
    /// Whether the container counts as ready (status.containerStatuses[].ready).
    pub ready: bool,
    /// The container has started (status.containerStatuses[].started).
    pub started: bool,
    /// Whether the container will be started again after it exits (restartPolicy).
    pub will_restart: bool,
}

/// What the agent knows about one Pod.
#[derive(Debug, Clone)]
pub struct PodState {
    /// The Pod's address once its network exists.
    pub ip: Option<Ipv4Addr>,
    /// The node address (status.hostIP).
    pub host_ip: Ipv4Addr,
    /// When the agent accepted the Pod (status.startTime).
    pub start_time: Time,
    /// One record per container, in spec order.
    pub containers: Vec<ContainerRecord>,
    transitions: BTreeMap<&'static str, (bool, Time)>,
}

impl PodState {
    /// A Pod whose containers are all waiting in ContainerCreating.
    pub fn new(containers: &[(String, String)], host_ip: Ipv4Addr) -> Self {
        PodState {
            ip: None,
            host_ip,
            start_time: crate::now(),
            containers: containers
                .iter()
                .map(|(name, image)| ContainerRecord {
                    name: name.clone(),
                    image: image.clone(),
                    restart_count: 0,
                    state: CState::Waiting {
                        reason: "ContainerCreating".into(),
                        message: String::new(),
                    },
                    last: None,
                    ready: false,
                    started: false,
                    will_restart: true,
                })
                .collect(),
            transitions: BTreeMap::new(),
        }
    }

    /// The container record by name.
    pub fn container_mut(&mut self, name: &str) -> Option<&mut ContainerRecord> {
        self.containers.iter_mut().find(|c| c.name == name)
    }

    fn condition(&mut self, kind: &'static str, value: bool) -> PodCondition {
        let entry = self
            .transitions
            .entry(kind)
            .or_insert_with(|| (value, crate::now()));
        if entry.0 != value {
            *entry = (value, crate::now());
        }
        PodCondition {
            type_: kind.into(),
            status: if value { "True" } else { "False" }.into(),
            last_transition_time: Some(entry.1.clone()),
            reason: (!value && (kind == "Ready" || kind == "ContainersReady"))
                .then(|| "ContainersNotReady".into()),
            ..Default::default()
        }
    }

    /// The Pod status to write.
    pub fn render(&mut self) -> PodStatus {
        let all_ready = !self.containers.is_empty() && self.containers.iter().all(|c| c.ready);
        let finished: Vec<&Terminated> = self
            .containers
            .iter()
            .filter(|c| !c.will_restart)
            .filter_map(|c| match &c.state {
                CState::Terminated(t) => Some(t),
                _ => None,
            })
            .collect();
        let phase = if !self.containers.is_empty() && finished.len() == self.containers.len() {
            if finished.iter().all(|t| t.exit_code == 0) {
                "Succeeded"
            } else {
                "Failed"
            }
        } else if self
            .containers
            .iter()
            .any(|c| matches!(c.state, CState::Running { .. }) || c.restart_count > 0)
        {
            "Running"
        } else {
            "Pending"
        };
        let net_ready = self.ip.is_some();
        let conditions = vec![
            self.condition("PodReadyToStartContainers", net_ready),
            self.condition("Initialized", true),
            self.condition("ContainersReady", all_ready),
            self.condition("Ready", all_ready),
            self.condition("PodScheduled", true),
        ];
        let statuses = self
            .containers
            .iter()
            .map(|c| ContainerStatus {
                name: c.name.clone(),
                image: c.image.clone(),
                image_id: String::new(),
                ready: c.ready,
                started: Some(c.started),
                restart_count: c.restart_count,
                state: Some(render_state(&c.state)),
                last_state: c
                    .last
                    .as_ref()
                    .map(|t| render_state(&CState::Terminated(t.clone()))),
                ..Default::default()
            })
            .collect();
        let gw = self.host_ip.to_string();
        PodStatus {
            phase: Some(phase.into()),
            pod_ip: self.ip.map(|i| i.to_string()),
            pod_ips: self.ip.map(|i| vec![PodIP { ip: i.to_string() }]),
            host_ip: Some(gw.clone()),
            host_ips: Some(vec![HostIP { ip: gw }]),
            start_time: Some(self.start_time.clone()),
            conditions: Some(conditions),
            container_statuses: Some(statuses),
            // qosClass is not written: the apiserver sets it at creation and it is immutable.
            ..Default::default()
        }
    }
}

fn render_state(s: &CState) -> ContainerState {
    match s {
        CState::Waiting { reason, message } => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.clone()),
                message: (!message.is_empty()).then(|| message.clone()),
            }),
            ..Default::default()
        },
        CState::Running { started_at } => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(started_at.clone()),
            }),
            ..Default::default()
        },
        CState::Terminated(t) => ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: t.exit_code,
                reason: Some(t.reason.clone()),
                started_at: t.started_at.clone(),
                finished_at: Some(t.finished_at.clone()),
                ..Default::default()
            }),
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_running_and_failed_phases() {
        let mut s = PodState::new(&[("a".into(), "img".into())], Ipv4Addr::new(10, 244, 0, 1));
        let st = s.render();
        assert_eq!(st.phase.as_deref(), Some("Pending"));
        s.ip = Some(Ipv4Addr::new(10, 244, 0, 2));
        let c = s.container_mut("a").unwrap();
        c.state = CState::Running {
            started_at: crate::now(),
        };
        c.ready = true;
        c.started = true;
        let st = s.render();
        assert_eq!(st.phase.as_deref(), Some("Running"));
        assert_eq!(st.pod_ip.as_deref(), Some("10.244.0.2"));
        let ready = st
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.status, "True");
        let c = s.container_mut("a").unwrap();
        c.ready = false;
        c.will_restart = false;
        c.state = CState::Terminated(Terminated {
            exit_code: 3,
            reason: "Error".into(),
            started_at: None,
            finished_at: crate::now(),
        });
        let st = s.render();
        assert_eq!(st.phase.as_deref(), Some("Failed"));
        let ready = st
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.status, "False");
    }
}
