//! JoinService's decision (issue 19.1, 18.13-18.15): re-join in place only within the token's
//! scope and trust level, trust recomputed from the identifiers, operators' approval of a platform
//! node matched by identifiers only, agentless pools, `nodes.move`.

use bc_protocol::{PoolAgent, PoolKind, SiteKind, Trust};
use cpl_store::{NewToken, TokenRefusal, Tx, now_ms};

use crate::error::OpError;
use crate::join::{JoinError, JoinFacts, JoinOutcome, join};
use crate::ops::membership::{approve_rejoin, move_node};
use crate::ops::pools::{self, NewPool};
use crate::ops::sites::{self, NewSite};
use crate::test_utils::TestResult;

/// A platform site with pools `a` and `b` (metal-host) and `none` (agent: none), a tenant's custom
/// site with pool `t`, and tokens for each (and for the platform site alone).
struct Fleet {
    site_p: String,
    site_c: String,
    pool_a: String,
    pool_b: String,
    pool_t: String,
    pool_none: String,
    tok_a: String,
    tok_b: String,
    tok_t: String,
    tok_none: String,
    tok_site_p: String,
}

fn pool(tx: &Tx<'_>, site: &str, kind: PoolKind, agent: PoolAgent) -> Result<String, OpError> {
    Ok(pools::create(
        tx,
        &NewPool {
            name: "p".into(),
            kind,
            agent,
            site_id: Some(site.into()),
            owner_tenant_id: None,
            hardware_profile: Default::default(),
            acceptance: Default::default(),
        },
    )?
    .id)
}

fn token(tx: &Tx<'_>, pool: Option<&str>, site: Option<&str>) -> Result<String, OpError> {
    let new = NewToken {
        pool_id: pool.map(str::to_owned),
        site_id: site.map(str::to_owned),
        ttl_ms: 3_600_000,
        max_uses: Some(10),
        description: None,
    };
    Ok(tx.create_token(&new, now_ms())?.1)
}

fn fleet(tx: &Tx<'_>) -> Result<Fleet, OpError> {
    let site = |kind, owner: Option<&str>| {
        sites::create(
            tx,
            &NewSite {
                name: "s".into(),
                kind,
                owner_tenant_id: owner.map(Into::into),
            },
        )
        .map(|s| s.id)
    };
    let site_p = site(SiteKind::Platform, None)?;
    let site_c = site(SiteKind::Custom, Some("tenant1"))?;
    let pool_a = pool(tx, &site_p, PoolKind::MetalHost, PoolAgent::Bcd)?;
    let pool_b = pool(tx, &site_p, PoolKind::MetalDedicated, PoolAgent::Bcd)?;
    let pool_t = pool(tx, &site_c, PoolKind::MetalHost, PoolAgent::Bcd)?;
    let pool_none = pool(tx, &site_p, PoolKind::Provider, PoolAgent::None)?;
    Ok(Fleet {
        tok_a: token(tx, Some(&pool_a), None)?,
        tok_b: token(tx, Some(&pool_b), None)?,
        tok_t: token(tx, Some(&pool_t), None)?,
        tok_none: token(tx, Some(&pool_none), None)?,
        tok_site_p: token(tx, None, Some(&site_p))?,
        site_p,
        site_c,
        pool_a,
        pool_b,
        pool_t,
        pool_none,
    })
}

fn facts(token: &str, key: &str, trusted: bool, digests: &[&str]) -> JoinFacts {
    JoinFacts {
        token: token.to_owned(),
        hardware_key: key.to_owned(),
        trusted,
        identifier_digests: digests.iter().map(|d| (*d).to_owned()).collect(),
        hostname: Some("h".into()),
        peer: Some("192.0.2.7:5000".into()),
        mode: bc_protocol::Mode::Node,
    }
}

/// A join in its own savepoint, as the gateway's transaction (rolled back on a refusal).
fn try_join(tx: &Tx<'_>, f: &JoinFacts) -> Result<JoinOutcome, JoinError> {
    tx.savepoint(|tx| join(tx, f, &|_| false))
}

fn joined(tx: &Tx<'_>, f: &JoinFacts) -> Result<String, Box<dyn std::error::Error>> {
    match try_join(tx, f)? {
        JoinOutcome::Joined(j) => Ok(j.node_id),
        other => Err(format!("expected a join, got {other:?}").into()),
    }
}

fn uses(tx: &Tx<'_>, token: &str) -> Result<u64, cpl_store::StoreError> {
    let id = token.split('.').next().unwrap_or_default();
    Ok(tx
        .tokens()?
        .into_iter()
        .find(|t| t.id == id)
        .map(|t| t.uses)
        .unwrap_or(0))
}

#[test]
fn a_tenant_token_with_two_of_a_platform_nodes_digests_takes_nothing_over() -> TestResult {
    let store = cpl_store::testing::store()?;
    store.write_blocking(|tx| -> TestResult {
        let f = fleet(tx)?;
        let victim = joined(tx, &facts(&f.tok_a, "kv", true, &["d1", "d2", "d3"]))?;
        let before = tx.node(&victim)?.ok_or("victim")?;
        // The repro: a token for a tenant's pool on a custom site, two digests a
        // neighbour can learn, and a claim of `trusted`.
        let attack = facts(&f.tok_t, "kv", true, &["d1", "d2"]);
        let err = try_join(tx, &attack)
            .err()
            .ok_or("the takeover must be refused")?;
        assert!(matches!(err, JoinError::WrongPool { .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.contains(&victim) && msg.contains(&f.pool_a), "{msg}");
        let after = tx.node(&victim)?.ok_or("victim")?;
        assert_eq!(after.identity_generation, before.identity_generation);
        assert_eq!(after.pool_id, before.pool_id);
        assert_eq!(uses(tx, &f.tok_t)?, 0, "a refused join spends no use");
        Ok(())
    })
}

#[test]
fn a_claim_of_trust_alone_grants_no_match_and_no_uniqueness() -> TestResult {
    let store = cpl_store::testing::store()?;
    store.write_blocking(|tx| -> TestResult {
        let f = fleet(tx)?;
        let victim = joined(tx, &facts(&f.tok_a, "kv", true, &["d1", "d2"]))?;
        assert!(tx.node(&victim)?.ok_or("victim")?.hardware_key_trusted);
        // The victim's key (learnable by anyone who knows its identifiers), claimed trusted, but
        // with none, one, or unrelated digests: never the victim's record, never its key's trust.
        for digests in [&[][..], &["d1"][..], &["x1", "x2"][..]] {
            let id = joined(tx, &facts(&f.tok_a, "kv", true, digests))?;
            assert_ne!(id, victim, "{digests:?}");
            let n = tx.node(&id)?.ok_or("new node")?;
            assert!(!n.hardware_key_trusted, "{digests:?}");
        }
        let v = tx.node(&victim)?.ok_or("victim")?;
        assert_eq!(v.identity_generation, 1);
        assert!(v.hardware_key_trusted);
        // A claim without two digests is no trusted key even for a fresh machine.
        let lone = joined(tx, &facts(&f.tok_a, "k-lone", true, &["only"]))?;
        assert!(!tx.node(&lone)?.ok_or("lone")?.hardware_key_trusted);
        Ok(())
    })
}

#[test]
fn a_platform_node_matched_by_identifiers_re_joins_only_once_approved() -> TestResult {
    let store = cpl_store::testing::store()?;
    store.write_blocking(|tx| -> TestResult {
        let f = fleet(tx)?;
        // No trusted key: the machine is known by its identifiers only.
        let id = joined(tx, &facts(&f.tok_a, "k1", false, &["d1", "d2"]))?;
        let v0 = tx.node(&id)?.ok_or("node")?.version;
        let again = facts(&f.tok_a, "k1", false, &["d1", "d2"]);
        let JoinOutcome::AwaitingApproval(p) = try_join(tx, &again)? else {
            return Err("a platform re-join by identifiers needs approval".into());
        };
        assert_eq!(p.node_id, id);
        assert!(p.new_request);
        let n = tx.node(&id)?.ok_or("node")?;
        assert_eq!(n.identity_generation, 1, "nothing taken over yet");
        assert_eq!(
            n.version, v0,
            "a request (agent-driven) never moves version"
        );
        assert_eq!(uses(tx, &f.tok_a)?, 1, "waiting spends no use");
        let ev = tx.events(&id)?;
        assert!(
            ev.iter()
                .any(|e| e.kind == "rejoinRequest" && e.to.as_deref() == Some("pending")),
            "{ev:?}"
        );
        // The agent retries with backoff: the same request, no new event.
        let JoinOutcome::AwaitingApproval(p2) = try_join(tx, &again)? else {
            return Err("still waiting".into());
        };
        assert_eq!(
            (p2.request_id.as_str(), p2.new_request),
            (p.request_id.as_str(), false)
        );
        assert_eq!(tx.events(&id)?.len(), ev.len());

        // A stale version or another request id approves nothing.
        assert!(matches!(
            tx.savepoint(|tx| approve_rejoin(tx, &id, v0 + 9, "operator:o", &p.request_id)),
            Err(OpError::Conflict { .. })
        ));
        assert!(matches!(
            tx.savepoint(|tx| approve_rejoin(tx, &id, v0, "operator:o", "rejoin_other")),
            Err(OpError::NotFound { .. })
        ));
        let approved = approve_rejoin(tx, &id, v0, "operator:o", &p.request_id)?;
        assert_eq!(approved.version, v0 + 1);
        // Another machine with the same two digests but another key is not what was approved.
        let JoinOutcome::AwaitingApproval(other) =
            try_join(tx, &facts(&f.tok_a, "k-other", false, &["d1", "d2"]))?
        else {
            return Err("other facts are not approved".into());
        };
        assert_ne!(other.request_id, p.request_id);
        // The approved machine's next attempt: approved again, then it re-joins in place.
        let n = tx.node(&id)?.ok_or("node")?;
        let req = tx.rejoin_request(&id)?.ok_or("request")?;
        approve_rejoin(tx, &id, n.version, "operator:o", &req.id)?;
        let JoinOutcome::AwaitingApproval(_) = try_join(tx, &again)? else {
            return Err("the approval was for the other machine".into());
        };
        let n = tx.node(&id)?.ok_or("node")?;
        let req = tx.rejoin_request(&id)?.ok_or("request")?;
        approve_rejoin(tx, &id, n.version, "operator:o", &req.id)?;
        let JoinOutcome::Joined(j) = try_join(tx, &again)? else {
            return Err("an approved re-join goes through".into());
        };
        assert!(j.rejoined);
        assert_eq!(
            (j.node_id.as_str(), j.identity_generation),
            (id.as_str(), 2)
        );
        assert!(tx.rejoin_request(&id)?.is_none(), "a request is used once");
        let ev = tx.events(&id)?;
        assert!(ev.iter().any(
            |e| e.kind == "identityGeneration" && e.message.contains("approved by operator:o")
        ));
        Ok(())
    })
}

#[test]
fn an_approval_never_outweighs_a_revoked_token() -> TestResult {
    let store = cpl_store::testing::store()?;
    store.write_blocking(|tx| -> TestResult {
        let f = fleet(tx)?;
        let id = joined(tx, &facts(&f.tok_a, "k1", false, &["d1", "d2"]))?;
        let again = facts(&f.tok_a, "k1", false, &["d1", "d2"]);
        let JoinOutcome::AwaitingApproval(p) = try_join(tx, &again)? else {
            return Err("waits".into());
        };
        let v = tx.node(&id)?.ok_or("node")?.version;
        approve_rejoin(tx, &id, v, "operator:o", &p.request_id)?;
        let tok_id = f.tok_a.split('.').next().unwrap_or_default();
        tx.revoke_token(tok_id)?;
        let err = try_join(tx, &again).err().ok_or("refused")?;
        assert!(
            matches!(err, JoinError::Token(TokenRefusal::Revoked { .. })),
            "{err}"
        );
        Ok(())
    })
}

#[test]
fn an_approved_re_join_outlives_its_tokens_expiry_and_spends_no_use() -> TestResult {
    let store = cpl_store::testing::store()?;
    store.write_blocking(|tx| -> TestResult {
        let f = fleet(tx)?;
        let short = tx
            .create_token(
                &NewToken {
                    pool_id: Some(f.pool_a.clone()),
                    ttl_ms: 200,
                    max_uses: Some(1),
                    ..Default::default()
                },
                now_ms(),
            )?
            .1;
        let id = joined(tx, &facts(&f.tok_a, "k1", false, &["d1", "d2"]))?;
        let again = facts(&short, "k1", false, &["d1", "d2"]);
        let JoinOutcome::AwaitingApproval(p) = try_join(tx, &again)? else {
            return Err("waits".into());
        };
        let v = tx.node(&id)?.ok_or("node")?.version;
        approve_rejoin(tx, &id, v, "operator:o", &p.request_id)?;
        std::thread::sleep(std::time::Duration::from_millis(250));
        // The token expired meanwhile: a new machine is refused with it, the approved one is not.
        let err = try_join(tx, &facts(&short, "k9", true, &["z1", "z2"]))
            .err()
            .ok_or("expired")?;
        assert!(
            matches!(err, JoinError::Token(TokenRefusal::Expired { .. })),
            "{err}"
        );
        let JoinOutcome::Joined(j) = try_join(tx, &again)? else {
            return Err("the approval lets it in without a new token".into());
        };
        assert_eq!(j.node_id, id);
        assert_eq!(uses(tx, &short)?, 0, "an approved re-join spends no use");
        Ok(())
    })
}

#[test]
fn trusted_keys_re_join_in_place_within_the_pool_or_the_site() -> TestResult {
    let store = cpl_store::testing::store()?;
    store.write_blocking(|tx| -> TestResult {
        let f = fleet(tx)?;
        let id = joined(tx, &facts(&f.tok_a, "kt", true, &["d1", "d2", "d3"]))?;
        // Same pool, trusted key and two of its digests: in place, no approval.
        let JoinOutcome::Joined(j) = try_join(tx, &facts(&f.tok_a, "kt", true, &["d1", "d3"]))?
        else {
            return Err("trusted key match".into());
        };
        assert_eq!(
            (j.node_id.as_str(), j.identity_generation),
            (id.as_str(), 2)
        );
        // A token for the node's site only is a site agent's (issue 14): a node agent is
        // refused with it, and nothing changes.
        let err = try_join(tx, &facts(&f.tok_site_p, "kt", true, &["d1", "d3"]))
            .err()
            .ok_or("site token")?;
        assert!(matches!(err, JoinError::WrongMode(_)), "{err}");
        let n = tx.node(&id)?.ok_or("node")?;
        assert_eq!(n.identity_generation, 2);
        assert_eq!(n.pool_id.as_deref(), Some(f.pool_a.as_str()));
        assert_eq!(n.site_id.as_deref(), Some(f.site_p.as_str()));
        // Another pool's token: refused, naming the pool the machine belongs to (18.15).
        let err = try_join(tx, &facts(&f.tok_b, "kt", true, &["d1", "d3"]))
            .err()
            .ok_or("another pool's token")?;
        let msg = err.to_string();
        assert!(
            matches!(err, JoinError::WrongPool { .. })
                && msg.contains(&f.pool_a)
                && msg.contains("nodes move"),
            "{msg}"
        );
        Ok(())
    })
}

#[test]
fn a_re_join_never_crosses_trust_levels_and_tenant_nodes_need_no_approval() -> TestResult {
    let store = cpl_store::testing::store()?;
    store.write_blocking(|tx| -> TestResult {
        let f = fleet(tx)?;
        // A tenant-owned node on the tenant's custom site re-joins by identifiers in its pool.
        let t = joined(tx, &facts(&f.tok_t, "k1", false, &["d1", "d2"]))?;
        assert_eq!(tx.node(&t)?.ok_or("t")?.trust, Trust::TenantOwned);
        let JoinOutcome::Joined(j) = try_join(tx, &facts(&f.tok_t, "k1", false, &["d1", "d2"]))?
        else {
            return Err("tenant-owned re-join".into());
        };
        assert_eq!(j.node_id, t);
        // Under a dedicated-root lease the node is tenant-controlled: its pool's token places
        // machines as platform, so no re-join in place.
        let p = joined(tx, &facts(&f.tok_a, "kp", true, &["e1", "e2"]))?;
        let v = tx.node(&p)?.ok_or("p")?.version;
        crate::ops::nodes::start_dedicated_root(tx, &p, v, "operator:o", "tenant9")?;
        let err = try_join(tx, &facts(&f.tok_a, "kp", true, &["e1", "e2"]))
            .err()
            .ok_or("across trust levels")?;
        assert!(matches!(err, JoinError::TrustMismatch { .. }), "{err}");
        Ok(())
    })
}

#[test]
fn a_bcd_agent_is_refused_from_a_pool_without_an_agent() -> TestResult {
    let store = cpl_store::testing::store()?;
    store.write_blocking(|tx| -> TestResult {
        let f = fleet(tx)?;
        let err = try_join(tx, &facts(&f.tok_none, "kn", true, &["n1", "n2"]))
            .err()
            .ok_or("agent: none")?;
        assert!(matches!(err, JoinError::AgentlessPool { .. }), "{err}");
        assert!(err.to_string().contains(&f.pool_none), "{err}");
        assert!(tx.nodes()?.is_empty(), "no node, and never provider-api/v1");
        assert_eq!(uses(tx, &f.tok_none)?, 0);
        Ok(())
    })
}

#[test]
fn a_node_moves_between_pools_with_role_and_trust_from_the_target() -> TestResult {
    let store = cpl_store::testing::store()?;
    store.write_blocking(|tx| -> TestResult {
        let f = fleet(tx)?;
        let id = joined(tx, &facts(&f.tok_a, "km", true, &["m1", "m2"]))?;
        let n = tx.node(&id)?.ok_or("node")?;
        assert_eq!(n.role, bc_protocol::NodeRole::Host);
        let refuse = |pool: &str, v: u64| {
            tx.savepoint(|tx| move_node(tx, &id, v, "operator:o", pool))
                .err()
                .map(|e| e.code())
        };
        use bc_protocol::ErrorCode;
        assert_eq!(
            refuse(&f.pool_none, n.version),
            Some(ErrorCode::InvalidArgument)
        );
        assert_eq!(
            refuse(&f.pool_t, n.version),
            Some(ErrorCode::InvalidArgument),
            "other site"
        );
        assert_eq!(refuse("pool_nope", n.version), Some(ErrorCode::NotFound));
        assert_eq!(refuse(&f.pool_b, n.version + 1), Some(ErrorCode::Conflict));
        let moved = move_node(tx, &id, n.version, "operator:o", &f.pool_b)?;
        assert_eq!(moved.pool_id.as_deref(), Some(f.pool_b.as_str()));
        assert_eq!(
            moved.role,
            bc_protocol::NodeRole::Dedicated,
            "metal-dedicated"
        );
        assert_eq!(moved.identity_generation, n.identity_generation);
        assert_eq!(moved.version, n.version + 1);
        let ev = tx.events(&id)?;
        assert!(
            ev.iter()
                .any(|e| e.kind == "pool" && e.to.as_deref() == Some(f.pool_b.as_str()))
        );
        assert!(ev.iter().any(|e| e.kind == "role"));
        // Now the new pool's token re-joins it in place, the old one does not.
        assert!(matches!(
            try_join(tx, &facts(&f.tok_a, "km", true, &["m1", "m2"])),
            Err(JoinError::WrongPool { .. })
        ));
        let JoinOutcome::Joined(j) = try_join(tx, &facts(&f.tok_b, "km", true, &["m1", "m2"]))?
        else {
            return Err("re-join in the new pool".into());
        };
        assert_eq!(j.node_id, id);
        let _ = f.site_c;
        Ok(())
    })
}

#[test]
fn site_agents_join_with_site_tokens_and_node_agents_with_pool_tokens() -> TestResult {
    let store = cpl_store::testing::store()?;
    store.write_blocking(|tx| -> TestResult {
        let f = fleet(tx)?;
        let site = |token: &str, key: &str, digests: &[&str]| JoinFacts {
            mode: bc_protocol::Mode::Site,
            ..facts(token, key, true, digests)
        };
        // A site agent with a site token: role site, no pool, the token's site.
        let id = joined(tx, &site(&f.tok_site_p, "ks", &["s1", "s2"]))?;
        let n = tx.node(&id)?.ok_or("node")?;
        assert_eq!(n.role, bc_protocol::NodeRole::Site);
        assert_eq!(n.pool_id, None);
        assert_eq!(n.site_id.as_deref(), Some(f.site_p.as_str()));
        // A site agent with a pool token: refused, naming what it needs.
        let before = uses(tx, &f.tok_a)?;
        let err = try_join(tx, &site(&f.tok_a, "kx", &["x1", "x2"]))
            .err()
            .ok_or("pool token")?;
        assert!(matches!(err, JoinError::WrongMode(_)), "{err}");
        assert!(err.to_string().contains("tokens create --site"), "{err}");
        assert_eq!(uses(tx, &f.tok_a)?, before, "a refusal spends no use");
        // A node agent with the site token: refused.
        let err = try_join(tx, &facts(&f.tok_site_p, "ky", true, &["y1", "y2"]))
            .err()
            .ok_or("site token, node agent")?;
        assert!(err.to_string().contains("--pool"), "{err}");
        // The site agent re-joins in place within its site.
        let JoinOutcome::Joined(j) = try_join(tx, &site(&f.tok_site_p, "ks", &["s1", "s2"]))?
        else {
            return Err("re-join".into());
        };
        assert_eq!(
            (j.node_id.as_str(), j.identity_generation),
            (id.as_str(), 2)
        );
        // A node agent on the site agent's machine (a pool token of the site) cannot take its
        // record over.
        let err = try_join(tx, &facts(&f.tok_a, "ks", true, &["s1", "s2"]));
        assert!(err.is_err());
        Ok(())
    })
}
