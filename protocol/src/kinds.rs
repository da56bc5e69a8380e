//! String enums of sites, pools and capacity (spec "Identity, ownership and generations": pool
//! kinds, site kinds, `agent`; "When a node is schedulable": capacity buckets), spelled as the
//! spec spells them in JSON and in SQL. The control plane's store writes them, its core reasons
//! about them, and the operator API returns them.

crate::string_enum! {
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

crate::string_enum! {
    /// What runs on a pool's machines: the daemon (`bcd`), or nothing (reached through the
    /// provider's API, adapter `provider-api/v1`).
    PoolAgent, "pool agent" {
        Bcd => "bcd",
        None => "none",
    }
}

crate::string_enum! {
    /// A site's kind: the platform's own, or a tenant's `custom` site (its nodes are
    /// `tenant-owned`).
    SiteKind, "site kind" {
        Platform => "platform",
        Custom => "custom",
    }
}

crate::string_enum! {
    /// The bucket of a pool's capacity a node's GPUs count in (spec "When a node is
    /// schedulable"): the first of the seven checks that fails names it.
    CapacityBucket, "capacity bucket" {
        /// Not a host, or its trust keeps its hardware out of this pool.
        Excluded => "excluded",
        /// In maintenance or cordoned.
        Maintenance => "maintenance",
        /// Not `adopted`/`deployed`, or has not converged its first spec.
        Provisioning => "provisioning",
        /// Connectivity is anything but `connected`.
        Unreachable => "unreachable",
        /// Some `noScheduleReasons` entry holds.
        Unhealthy => "unhealthy",
        /// Schedulable.
        Available => "available",
    }
}
