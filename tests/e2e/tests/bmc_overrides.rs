//! Boot overrides, tasks and reset types as real BMCs take them (issue 31, rules 1–4), through a
//! real `bcctl serve` and `bcd site` and the BMC behaviour simulator (`bc_bmc_sim`) in front of
//! sushy-emulator. Each test checks what really happened at the BMC (what booted, the override
//! it holds, what it was sent), what bcd believes (commands, the power axis, the provision
//! state) and what the operator sees (command errors, conditions, events).
//!
//! Skipped loudly without sushy-emulator; a failure under `CI=true`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/bmc_rig.rs"]
mod rig;
#[path = "support/bare_metal.rs"]
mod support;

use bc_bmc_sim::{Behaviour, TaskPlan};
use bcd_site::test_utils::sushy::FakeSystem;
use rig::Rig;
use serde_json::Value;
use std::time::Duration;

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

fn message(c: &Value) -> String {
    c["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Rule 1 and rule 4: a PATCH the BMC answered but did not store fails saying what was asked
/// and what reads back; a BMC that stores `Once` as `Continuous` and requires the mode boots
/// the ramdisk all the same (one refusal, one fallback with the mode), and the override is
/// cleared once the ramdisk joined; a BMC that refuses the mode never gets one.
#[test]
fn overrides_are_read_back_reconciled_and_cleared_after_the_join() {
    let systems = [
        FakeSystem::numbered(31),
        FakeSystem::numbered(32),
        FakeSystem::numbered(33),
    ];
    let Some(mut rig) = Rig::start("bmc overrides e2e", &systems, &[], &[]) else {
        return;
    };
    let lost = rig.sim(
        &systems[0],
        Behaviour {
            override_lost: true,
            ..Behaviour::default()
        },
    );
    let continuous = rig.sim(
        &systems[1],
        Behaviour {
            once_as_continuous: true,
            mode_required: true,
            ..Behaviour::default()
        },
    );
    let refuses_mode = rig.sim(
        &systems[2],
        Behaviour {
            mode_refused: true,
            ..Behaviour::default()
        },
    );
    let _m1 = rig.machine(&continuous, &systems[1]);
    let _m2 = rig.machine(&refuses_mode, &systems[2]);

    // A lost override: the BMC answered 204 and stores nothing.
    let a = rig.enroll("lost", &lost.address(), false);
    rig.verified(&a);
    let c = rig.boot_device(&a, "pxe", false);
    assert_eq!(c["state"], "failed", "a lost override reported as set: {c}");
    let m = message(&c);
    assert!(
        m.contains("Pxe") && m.contains("None"),
        "asked and read back: {c}"
    );
    assert_eq!(lost.boot_override().target, "None", "the BMC holds nothing");

    // Once stored as Continuous, the mode required: the ramdisk boots, the override goes.
    let b = rig.enroll("continuous", &continuous.address(), true);
    rig.state(&b, "ready");
    let boots = continuous.boots();
    assert_eq!(
        boots.iter().filter(|x| x.device == "Pxe").count(),
        1,
        "{boots:?}"
    );
    let patches: Vec<_> = continuous
        .requests()
        .into_iter()
        .filter(|r| r.method == "PATCH")
        .collect();
    let refused = patches.iter().filter(|r| r.status == 400).count();
    assert!(refused <= 1, "tried once, fell back once: {patches:?}");
    assert!(
        patches
            .iter()
            .any(|r| r.status < 300 && r.body.contains("BootSourceOverrideMode")),
        "the mode is sent where it is required: {patches:?}"
    );
    rig.until(&b, "the override cleared after the join", |_| {
        (continuous.boot_override().enabled == "Disabled").then_some(())
    });
    rig.until(&b, "powered off when ready", |n| {
        (n["bmc"]["power"] == "off").then_some(())
    });
    assert_eq!(rig.real_power(&systems[1]), "Off");

    // A BMC that refuses the mode: never sent one.
    let r = rig.enroll("refuses-mode", &refuses_mode.address(), true);
    rig.state(&r, "ready");
    for p in refuses_mode
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH")
    {
        assert!(
            !p.body.contains("BootSourceOverrideMode") && p.status < 300,
            "an unchanged mode is never rewritten: {p:?}"
        );
    }
}

/// Rule 2: a 202 is followed to the task's end (nothing else is sent to the system meanwhile),
/// and a task that ends in `Exception` fails the command with the task's message.
#[test]
fn accepted_changes_are_followed_to_their_end() {
    let systems = [FakeSystem::numbered(34), FakeSystem::numbered(35)];
    let Some(mut rig) = Rig::start("bmc tasks e2e", &systems, &[], &[]) else {
        return;
    };
    let plan = TaskPlan {
        runs: Duration::from_secs(2),
        retry_after_s: 1,
        fails: false,
    };
    let tasks = rig.sim(
        &systems[0],
        Behaviour {
            patch_task: Some(plan),
            reset_task: Some(plan),
            ..Behaviour::default()
        },
    );
    let failing = rig.sim(
        &systems[1],
        Behaviour {
            patch_task: Some(TaskPlan {
                fails: true,
                ..plan
            }),
            ..Behaviour::default()
        },
    );
    let _m = rig.machine(&tasks, &systems[0]);

    let a = rig.enroll("tasks", &tasks.address(), true);
    rig.state(&a, "ready");
    let c = tasks.counters();
    assert_eq!(
        c.requests_during_task,
        0,
        "requests sent while a task ran: {:?}",
        tasks
            .requests()
            .iter()
            .filter(|r| r.during_task)
            .collect::<Vec<_>>()
    );
    assert!(
        tasks
            .requests()
            .iter()
            .any(|r| r.path.contains("/TaskMonitors/")),
        "the task monitor was never read"
    );
    let boots = tasks.boots();
    assert_eq!(boots.len(), 1, "{boots:?}");
    assert_eq!(boots[0].device, "Pxe", "{boots:?}");

    let b = rig.enroll("failing-task", &failing.address(), false);
    rig.verified(&b);
    let c = rig.boot_device(&b, "pxe", false);
    assert_eq!(
        c["state"], "failed",
        "a task in Exception is not success: {c}"
    );
    let m = message(&c);
    assert!(
        m.contains("Exception") && m.contains("Base.1.8.InternalError"),
        "the task's end and message: {c}"
    );
    assert_eq!(failing.boot_override().enabled, "Disabled");
}

/// Rule 3: only values the BMC advertises are sent: a reboot where the system offers
/// `PowerCycle` but no `ForceRestart` (listed in an ActionInfo), a one-time override where only
/// `Continuous` is offered.
#[test]
fn only_advertised_values_are_sent() {
    let mut on = FakeSystem::numbered(36);
    on.on = true;
    let systems = [on, FakeSystem::numbered(37)];
    let Some(mut rig) = Rig::start("bmc allowable values e2e", &systems, &[], &[]) else {
        return;
    };
    let cycle = rig.sim(
        &systems[0],
        Behaviour {
            reset_types: strings(&["On", "ForceOff", "PowerCycle"]),
            reset_action_info: true,
            ..Behaviour::default()
        },
    );
    let continuous_only = rig.sim(
        &systems[1],
        Behaviour {
            enabled_values: Some(strings(&["Disabled", "Continuous"])),
            ..Behaviour::default()
        },
    );
    let a = rig.enroll("cycle", &cycle.address(), false);
    rig.verified(&a);
    let c = rig.power(&a, "reboot");
    assert_eq!(c["state"], "succeeded", "{c}");
    let resets: Vec<String> = cycle
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("ComputerSystem.Reset"))
        .map(|r| r.body.clone())
        .collect();
    assert!(
        !resets.is_empty() && resets.iter().all(|b| b.contains("PowerCycle")),
        "a reboot without ForceRestart is a PowerCycle: {resets:?}"
    );

    let b = rig.enroll("continuous-only", &continuous_only.address(), false);
    rig.verified(&b);
    let c = rig.boot_device(&b, "pxe", false);
    assert_eq!(c["state"], "succeeded", "{c}");
    assert_eq!(c["result"]["persistent"], true, "what the BMC holds: {c}");
    for p in continuous_only
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH")
    {
        assert!(!p.body.contains("\"Once\""), "Once is not offered: {p:?}");
    }
    assert_eq!(continuous_only.boot_override().target, "Pxe");
}

/// Rule 4: on a machine that is on, whose BMC offers no restart and forgets a one-time
/// override at a power-off, the override is set after the power-off and right before the
/// power-on, never with a power-off in between; the machine boots the ramdisk.
#[test]
fn a_one_time_override_is_set_right_before_the_boot() {
    let mut on = FakeSystem::numbered(38);
    on.on = true;
    let systems = [on];
    let Some(mut rig) = Rig::start("bmc override order e2e", &systems, &[], &[]) else {
        return;
    };
    let sim = rig.sim(
        &systems[0],
        Behaviour {
            reset_types: strings(&["On", "ForceOff"]),
            power_off_clears_once: true,
            ..Behaviour::default()
        },
    );
    let _m = rig.machine(&sim, &systems[0]);
    let a = rig.enroll("no-restart", &sim.address(), true);
    rig.state(&a, "ready");
    let reqs = sim.requests();
    let off = reqs
        .iter()
        .position(|r| r.method == "POST" && r.body.contains("ForceOff"))
        .expect("a power-off before the boot");
    let patch = reqs
        .iter()
        .position(|r| r.method == "PATCH" && r.body.contains("Pxe") && r.status < 300)
        .expect("the override");
    assert!(
        off < patch,
        "the override came before the power-off: {reqs:?}"
    );
    let boots = sim.boots();
    assert!(boots.iter().any(|b| b.device == "Pxe"), "{boots:?}");
}
