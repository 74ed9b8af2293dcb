//! The alert rules' registry: the config file's `alerts.rules:` section, one entry per rule of
//! the catalogue ([`super::conditions`]), and the set of enabled rules with their state that
//! evaluates each snapshot.
use super::conditions::{
    ghost_process, gpu_allocated_idle, gpu_ecc_errors, gpu_imbalance, gpu_lost, gpu_memory_high,
    gpu_temperature_high, gpu_underutilized, gpu_xid_errors, memory_leak, power_cap_low_util,
};
use super::rule::{Evaluation, Outcomes, Rule, Severity, SnapshotView};
use crate::field_error::FieldError;
use crate::model::Snapshot;
use serde::Deserialize;
use std::time::Duration;

use memory_leak::{LeakRule, Memory};

macro_rules! registry {
    ($($field:ident : $ty:ty => $make:expr,)*) => {
        /// Every rule, each with `enabled`, `for` and `severity` besides its own thresholds.
        #[derive(Clone, Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct RulesConfig {
            $(pub $field: $ty,)*
        }

        /// The rule names, as in the config file and in alerts.
        pub const RULE_NAMES: &[&str] = &[$(stringify!($field),)*];

        impl RulesConfig {
            /// Whether the rule named `name` runs (`false` for an unknown name).
            pub fn is_enabled(&self, name: &str) -> bool {
                match name {
                    $(stringify!($field) => self.$field.enabled,)*
                    _ => false,
                }
            }

            /// The enabled rules, each with its state, in the order above.
            fn build(&self) -> Vec<Registered> {
                let mut rules = Vec::new();
                $(
                    if self.$field.enabled {
                        let make: fn(&$ty) -> Box<dyn Rule> = $make;
                        rules.push(Registered {
                            name: stringify!($field),
                            severity: self.$field.severity,
                            for_: self.$field.for_,
                            rule: make(&self.$field),
                        });
                    }
                )*
                rules
            }
        }
    };
}

registry! {
    gpu_underutilized: gpu_underutilized::Config => |c| Box::new(c.clone()),
    gpu_memory_high: gpu_memory_high::Config => |c| Box::new(c.clone()),
    gpu_temperature_high: gpu_temperature_high::Config => |c| Box::new(c.clone()),
    gpu_memory_leak: memory_leak::Config => |c| Box::new(LeakRule::new(c, Memory::Gpu)),
    cpu_memory_leak: memory_leak::Config => |c| Box::new(LeakRule::new(c, Memory::Host)),
    gpu_imbalance: gpu_imbalance::Config => |c| Box::new(c.clone()),
    power_cap_low_util: power_cap_low_util::Config => |c| Box::new(c.clone()),
    gpu_lost: gpu_lost::Config => |c| Box::new(c.clone()),
    gpu_ecc_errors: gpu_ecc_errors::Config => |c| Box::new(c.clone()),
    gpu_xid_errors: gpu_xid_errors::Config => |c| Box::new(gpu_xid_errors::XidRule::new(c)),
    ghost_process: ghost_process::Config => |c| Box::new(ghost_process::GhostRule::new(c)),
    gpu_allocated_idle: gpu_allocated_idle::Config => |c| Box::new(c.clone()),
}

impl RulesConfig {
    /// The first value that makes no sense, at its `rule.field`.
    pub fn validate(&self) -> Result<(), FieldError> {
        let within = |rule: &'static str| move |e: FieldError| e.within(rule);
        self.gpu_underutilized
            .validate()
            .map_err(within("gpu_underutilized"))?;
        self.gpu_memory_high
            .validate()
            .map_err(within("gpu_memory_high"))?;
        self.gpu_imbalance
            .validate()
            .map_err(within("gpu_imbalance"))?;
        self.power_cap_low_util
            .validate()
            .map_err(within("power_cap_low_util"))?;
        self.gpu_memory_leak
            .validate()
            .map_err(within("gpu_memory_leak"))?;
        self.cpu_memory_leak
            .validate()
            .map_err(within("cpu_memory_leak"))?;
        Ok(())
    }
}

/// One enabled rule and what it is registered with.
struct Registered {
    name: &'static str,
    severity: Severity,
    for_: Duration,
    rule: Box<dyn Rule>,
}

/// The enabled rules, each with what it remembers between snapshots (leak series, the last Xid,
/// the containers ghosts were last seen in).
pub struct Rules(Vec<Registered>);

impl Rules {
    pub fn new(config: &RulesConfig) -> Self {
        Self(config.build())
    }

    /// Every enabled rule's outcome for each of its subjects in `snap`.
    pub fn evaluate(&mut self, snap: &Snapshot) -> Vec<Evaluation> {
        let round = SnapshotView::new(snap);
        let mut out = Vec::new();
        let mut outcomes = Outcomes::new();
        for r in &mut self.0 {
            r.rule.evaluate(&round, &mut outcomes);
            out.extend(
                outcomes
                    .drain(..)
                    .map(|(key, subject, outcome)| Evaluation {
                        rule: r.name,
                        severity: r.severity,
                        for_: r.for_,
                        key: format!("{}/{key}", r.name),
                        subject,
                        outcome,
                    }),
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::rule::Outcome;
    use crate::model::test_support::{container, gpu, snapshot};

    #[test]
    fn every_rule_is_registered_once_under_its_config_name() {
        let mut names = RULE_NAMES.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), RULE_NAMES.len());
        let config = RulesConfig::default();
        assert!(RULE_NAMES.iter().all(|n| config.is_enabled(n)));
        assert!(!config.is_enabled("no_such_rule"));
        let built: Vec<_> = config.build().into_iter().map(|r| r.name).collect();
        assert_eq!(built, RULE_NAMES);
    }

    #[test]
    fn a_disabled_rule_says_nothing_and_keys_carry_the_rule() {
        let mut w = container("train");
        w.gpu.processes = 1;
        w.gpu.busy_fraction = Some(0.1);
        let mut hot = gpu(0);
        hot.device.temperature_celsius = Some(95);
        let snap = snapshot(0, vec![hot], vec![w]);
        let mut config = RulesConfig::default();
        config.gpu_temperature_high.enabled = false;
        config.gpu_temperature_high.for_ = Duration::from_secs(7);
        let evaluations = Rules::new(&config).evaluate(&snap);
        assert!(evaluations.iter().all(|e| e.rule != "gpu_temperature_high"));
        let under = evaluations
            .iter()
            .find(|e| e.rule == "gpu_underutilized")
            .expect("evaluated");
        assert_eq!(
            under.key,
            format!("gpu_underutilized/{}", snap.workloads[0].id)
        );
        assert_eq!(
            (under.severity, under.for_),
            (Severity::Warning, Duration::from_secs(60))
        );
        assert!(matches!(under.outcome, Outcome::Breached(_)));
        config.gpu_temperature_high.enabled = true;
        let hot = Rules::new(&config)
            .evaluate(&snap)
            .into_iter()
            .find(|e| e.rule == "gpu_temperature_high")
            .expect("enabled again");
        assert_eq!(
            (hot.key.as_str(), hot.for_),
            ("gpu_temperature_high/GPU-00000000", Duration::from_secs(7))
        );
    }

    #[test]
    fn validation_names_rule_and_field() {
        let mut config = RulesConfig::default();
        config.gpu_imbalance.spread_percent = 150.0;
        let e = config.validate().unwrap_err();
        assert_eq!(e.field, "gpu_imbalance.spread_percent");
        assert_eq!(e.message, "150 is not a percentage (0–100)");
    }
}
