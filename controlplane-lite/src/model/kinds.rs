//! String enums of sites and pools (spec "Identity, ownership and generations": pool kinds, site
//! kinds, `agent`), spelled as the spec spells them in JSON and in SQL.

bc_protocol::string_enum! {
    /// A pool's kind; decides the `role` of the nodes that join it.
    PoolKind, "pool kind" {
        /// Bare-metal GPU hosts that run the platform's VMs: role `host`.
        MetalHost => "metal-host",
        /// Existing servers running VPS workloads: role `host`.
        VpsHost => "vps-host",
        /// Machines of an outside provider: role `host`.
        Provider => "provider",
        /// Whole machines leased to one tenant: role `dedicated`.
        MetalDedicated => "metal-dedicated",
    }
}

bc_protocol::string_enum! {
    /// What runs on a pool's machines: the daemon (`bcd`), or nothing (reached through the
    /// provider's API, adapter `provider-api/v1`).
    PoolAgent, "pool agent" {
        Bcd => "bcd",
        None => "none",
    }
}

bc_protocol::string_enum! {
    /// A site's kind: the platform's own, or a tenant's `custom` site (its nodes are
    /// `tenant-owned`).
    SiteKind, "site kind" {
        Platform => "platform",
        Custom => "custom",
    }
}
