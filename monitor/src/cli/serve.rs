//! `gpuwatch serve`: the agent as a service: Prometheus metrics, the JSON API, the alert rules.
use super::{stop_on_signals, PrivilegeArgs, RunArgs, SourceArgs};
use anyhow::{Context, Result};
use clap::Args;
use gpuwatch::config::Config;
use gpuwatch::runtime::Agent;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    pub(crate) sources: SourceArgs,
    /// Address to listen on (host:port; `0.0.0.0:9879` for every interface).
    #[arg(long = "web.listen-address", default_value = "127.0.0.1:9879")]
    pub(crate) listen_address: String,
    /// Exporter web-config file: TLS (`tls_server_config`) and basic auth
    /// (`basic_auth_users`, bcrypt), as Prometheus exporters read it.
    #[arg(long = "web.config.file")]
    pub(crate) web_config_file: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) run: RunArgs,
    #[command(flatten)]
    pub(crate) privileges: PrivilegeArgs,
}

pub(crate) fn serve(args: &ServeArgs, config: &Config) -> Result<()> {
    use gpuwatch::serve::web_config::{BasicAuth, WebConfig};
    use gpuwatch::serve::{LatestPublished, LoginGate, Site};
    use std::sync::{Arc, RwLock};
    let interval = args.run.interval_or(config.serve_interval)?;
    let agent_config = args.sources.agent_config(config);
    let user = args.privileges.identity(&agent_config)?;
    let files = gpuwatch::serve::raise_file_limit();
    tracing::info!(
        "open-file limit {files}: serving up to {} connections at once",
        gpuwatch::serve::connection_limit()
    );
    let web = match &args.web_config_file {
        Some(p) => WebConfig::load(p)?.0,
        None => WebConfig::default(),
    };
    let tls = web.tls()?;
    let mut headers = Vec::new();
    for (k, v) in web.http_server_config.iter().flat_map(|h| &h.headers) {
        let name = hyper::header::HeaderName::from_bytes(k.as_bytes())
            .with_context(|| format!("web config: header name {k:?}"))?;
        let value = hyper::header::HeaderValue::from_str(v)
            .with_context(|| format!("web config: value of header {k}"))?;
        headers.push((name, value));
    }
    let published: LatestPublished = Arc::new(RwLock::new(None));
    let site = Arc::new(Site {
        published: published.clone(),
        auth: BasicAuth::new(web.basic_auth_users.clone()).map(LoginGate::new),
        headers,
        // Rounds are published when the GPU series covers them: one can be a series interval
        // late, and the next comes a series interval after it.
        stale_after: interval * 3 + config.sources.nvml_series_interval * 2,
        heartbeat: std::sync::OnceLock::new(),
        stall_limit: gpuwatch::heartbeat::stall_limit(interval),
        page_refresh: interval,
        responses: gpuwatch::serve::response_budget(),
        renders: Arc::new(tokio::sync::Semaphore::new(
            gpuwatch::serve::RENDERS_AT_ONCE,
        )),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // Renders and bcrypt checks, each behind its own bound: a thread pool (and its malloc
        // arenas) that cannot grow with a flood of requests.
        .max_blocking_threads(8)
        .thread_name(gpuwatch::runtime::privileges::UNPRIVILEGED_THREADS)
        .enable_all()
        .build()
        .context("starting the HTTP runtime")?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(&args.listen_address))
        .with_context(|| format!("listening on {}", args.listen_address))?;
    let bound = listener
        .local_addr()
        .context("reading the listening address")?;
    if tls.is_none() && !web.basic_auth_users.is_empty() {
        tracing::warn!(
            "basic auth without TLS: passwords cross the network in the clear; set \
             tls_server_config in the web config"
        );
    }
    let scheme = if tls.is_some() { "https" } else { "http" };
    eprintln!("gpuwatch serve: listening on {scheme}://{bound}");
    let (shutdown, shutdown_rx) = tokio::sync::watch::channel(false);
    runtime.spawn(gpuwatch::serve::run(
        listener,
        tls,
        site.clone(),
        shutdown_rx,
    ));

    let stop = stop_on_signals()?;
    let mut agent =
        Agent::start(&agent_config, Duration::from_secs(3)).context("starting the agent")?;
    args.privileges.apply(&agent, user.as_ref())?;
    let _ = site.heartbeat.set(agent.sampler.heartbeat());
    let mut publisher = gpuwatch::output::published::Publisher::new(true);
    let result = gpuwatch::runtime::daemon::run_rounds(
        &mut agent,
        config,
        interval,
        args.run.duration,
        &stop,
        |snap, _, engine| -> Result<()> {
            let exported = Arc::new(publisher.publish(snap, engine.active()));
            if let Ok(mut p) = published.write() {
                *p = Some(exported);
            }
            Ok(())
        },
    );
    let _ = shutdown.send(true);
    runtime.shutdown_timeout(Duration::from_secs(2));
    result
}
