//! `sweety-node-agent run ...`: register a Node and run its Pods as local processes (needs root).
//! `sweety-node-agent load-balancer ...`: only the LoadBalancer allocator, beside a real kubelet (e2e/realnode).
//! `sweety-node-agent exec-container ...`: internal helper the agent runs inside a Pod's namespaces.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use sweety_node_agent::agent::{Agent, Config};
use sweety_node_agent::imagemap::ImageMap;
use sweety_node_agent::node::{self, NodeConfig};

#[derive(Parser)]
#[command(
    version,
    about = "Docker-less test kubelet: runs Pods as local processes in per-Pod netns"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Register the Node and run the Pods bound to it (KUBECONFIG selects the cluster).
    Run(RunArgs),
    /// Only the LoadBalancer allocator (no Node, no Pods): for a cluster whose node is a real kubelet with a
    /// CNI bridge carrying the first address of --pod-cidr (the bridge must exist; it is never deleted).
    LoadBalancer(LbArgs),
    /// Internal: bind-mount volumes, then exec the container program (run by the agent via `ip netns exec`).
    #[command(hide = true)]
    ExecContainer(ExecArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// Node name.
    #[arg(long, default_value = "sweety-node-1")]
    node: String,
    /// Extra Node label KEY=VALUE (repeatable).
    #[arg(long = "node-label")]
    node_labels: Vec<String>,
    /// IMAGE_SUBSTRING=/path/to/binary (repeatable); see README for the matching rule.
    #[arg(long = "image-map")]
    image_map: Vec<String>,
    /// Bridge carrying the first address of --pod-cidr (created if missing, and then deleted on exit).
    /// Pod namespaces and veths are named after it, so agents on different bridges do not collide.
    #[arg(long, default_value = "sweetybr0")]
    bridge: String,
    /// Pod network, a /24: the bridge gets .1, Pods .2-.199, LoadBalancer addresses .200-.250.
    #[arg(long, default_value = "10.244.0.0/24")]
    pod_cidr: String,
    /// Do not relay the apiserver onto the bridge address (Pods then cannot reach it).
    #[arg(long)]
    no_apiserver_relay: bool,
    /// State directory (per-Pod volumes, container logs).
    #[arg(long, default_value = "/run/sweety-node-agent")]
    root_dir: PathBuf,
    #[arg(long, default_value = "16")]
    cpu: String,
    #[arg(long, default_value = "64Gi")]
    memory: String,
    #[arg(long, default_value = "110")]
    max_pods: String,
    /// Port of the kubelet-style logs API on the bridge address (0 disables it).
    #[arg(long, default_value_t = 10250)]
    kubelet_port: u16,
    /// Assign LoadBalancer Service addresses from .200-.250 of --pod-cidr and forward their ports.
    #[arg(long)]
    load_balancer: bool,
}

#[derive(clap::Args)]
struct LbArgs {
    /// The bridge the Pods are on; the allocated addresses are added to it as /32s.
    #[arg(long)]
    bridge: String,
    /// Pod network, a /24: addresses are allocated from .200-.250 (keep the CNI's IPAM range below .200).
    #[arg(long)]
    pod_cidr: String,
}

#[derive(clap::Args)]
struct ExecArgs {
    /// SRC DST bind mount (repeatable).
    #[arg(long, num_args = 2, value_names = ["SRC", "DST"])]
    bind: Vec<String>,
    #[arg(long)]
    workdir: Option<String>,
    program: String,
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Cmd::ExecContainer(a) => {
            let binds: Vec<(String, String)> = a
                .bind
                .chunks(2)
                .map(|c| (c[0].clone(), c[1].clone()))
                .collect();
            let err = sweety_node_agent::container::exec_container(
                &binds,
                a.workdir.as_deref(),
                &a.program,
                &a.args,
            );
            Err(anyhow::Error::new(err).context("exec-container"))
        }
        Cmd::Run(a) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("tokio runtime")?
            .block_on(run(a)),
        Cmd::LoadBalancer(a) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("tokio runtime")?
            .block_on(load_balancer(a)),
    }
}

fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .init();
}

async fn load_balancer(a: LbArgs) -> anyhow::Result<()> {
    init_tracing();
    let cidr = sweety_node_agent::net::PodCidr::parse(&a.pod_cidr)?;
    sweety_node_agent::net::check_bridge_name(&a.bridge)?;
    let client = kube::Client::try_default()
        .await
        .context("kube client (KUBECONFIG)")?;
    let state: Arc<tokio::sync::Mutex<std::collections::HashMap<String, std::net::Ipv4Addr>>> =
        Default::default();
    let lb = tokio::spawn(sweety_node_agent::lb::run(
        client,
        a.bridge.clone(),
        cidr,
        Arc::clone(&state),
    ));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT"),
        _ = term.recv() => tracing::info!("SIGTERM"),
    }
    lb.abort();
    sweety_node_agent::lb::release_all(&a.bridge, &state).await;
    Ok(())
}

async fn run(a: RunArgs) -> anyhow::Result<()> {
    init_tracing();
    let images = ImageMap::parse(&a.image_map)?;
    let cidr = sweety_node_agent::net::PodCidr::parse(&a.pod_cidr)?;
    sweety_node_agent::net::check_bridge_name(&a.bridge)?;
    let gateway = cidr.gateway();
    let mut labels = BTreeMap::new();
    for l in &a.node_labels {
        let (k, v) = l
            .split_once('=')
            .with_context(|| format!("--node-label {l:?}: expected KEY=VALUE"))?;
        labels.insert(k.to_string(), v.to_string());
    }
    let kube_config = kube::Config::infer()
        .await
        .context("kube client config (KUBECONFIG)")?;
    let cluster_url = kube_config.cluster_url.clone();
    let client = kube::Client::try_from(kube_config).context("kube client")?;
    let ncfg = NodeConfig {
        name: a.node.clone(),
        labels,
        cpu: a.cpu,
        memory: a.memory,
        pods: a.max_pods,
        address: gateway,
        kubelet_port: (a.kubelet_port != 0).then_some(a.kubelet_port),
    };
    let agent_exe = std::env::current_exe().context("locating the agent binary")?;
    let api_target = sweety_node_agent::apiserver::target_of(&cluster_url).await?;
    let base_env = if a.no_apiserver_relay {
        Vec::new()
    } else {
        sweety_node_agent::env::apiserver_env(&gateway.to_string(), api_target.port())
    };
    let agent = Agent::new(
        client.clone(),
        Config {
            node_name: a.node.clone(),
            images,
            root_dir: a.root_dir.clone(),
            agent_exe,
            base_env,
        },
        &a.bridge,
        cidr,
    )
    .await?;
    // After the bridge exists: its address is where the relay listens.
    let relay = if a.no_apiserver_relay {
        None
    } else {
        let listen = std::net::SocketAddr::from((gateway, api_target.port()));
        match sweety_node_agent::apiserver::relay(listen, api_target).await {
            Ok(t) => Some(t),
            Err(e) => {
                agent.shutdown().await;
                return Err(e.into());
            }
        }
    };
    let server = (a.kubelet_port != 0).then(|| {
        let addr = std::net::SocketAddr::from((gateway, a.kubelet_port));
        let logs = a.root_dir.join("logs");
        tokio::spawn(async move {
            if let Err(e) = sweety_node_agent::server::serve(addr, logs).await {
                tracing::error!(error = %e, "kubelet API");
            }
        })
    });
    node::register(&client, &ncfg).await?;
    tracing::info!(node = %a.node, "node registered");
    let hb = tokio::spawn(node::heartbeat(client.clone(), ncfg));
    let lb_state: Arc<tokio::sync::Mutex<std::collections::HashMap<String, std::net::Ipv4Addr>>> =
        Default::default();
    let lb = a.load_balancer.then(|| {
        tokio::spawn(sweety_node_agent::lb::run(
            client.clone(),
            a.bridge.clone(),
            cidr,
            Arc::clone(&lb_state),
        ))
    });
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = agent.run() => tracing::warn!("pod watch ended"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT"),
        _ = term.recv() => tracing::info!("SIGTERM"),
    }
    hb.abort();
    if let Some(lb) = lb {
        lb.abort();
        sweety_node_agent::lb::release_all(&a.bridge, &lb_state).await;
    }
    if let Some(s) = server {
        s.abort();
    }
    if let Some(r) = relay {
        r.abort();
    }
    agent.shutdown().await;
    Ok(())
}
