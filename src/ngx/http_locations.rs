//! Every location of a configured http block, with the thread pool its
//! `aio threads` uses: how a pool that this module runs is found in use by
//! nginx's file I/O as well, which would post tasks no thread ever takes.

use super::sys;

/// A location (or a server's or the http block's own configuration) whose
/// `aio threads` names a pool fixed at configuration time.
pub struct AioUser {
    /// The location's name (`/files`, `@named`, `~ regex`), empty for a
    /// server's own configuration.
    pub location: String,
    pub pool: *mut sys::ngx_thread_pool_t,
}

/// The `aio threads` users of the http block of `cycle`. Variables in
/// `aio threads=$var` are resolved per request and are not listed.
///
/// # Safety
/// `cycle` must be a configured cycle (init_module or later): its location
/// trees are built.
pub unsafe fn aio_users(cycle: *mut sys::ngx_cycle_t) -> Vec<AioUser> {
    let mut users = Vec::new();
    // SAFETY: the core module's main conf of a configured http block; its
    // servers array holds ngx_http_core_srv_conf_t pointers, each with its
    // own configuration context, all in the cycle's pool.
    unsafe {
        let cmcf = super::conf::http_main_conf(cycle, &raw const sys::ngx_http_core_module)
            as *mut sys::ngx_http_core_main_conf_t;
        if cmcf.is_null() {
            return users;
        }
        let servers = std::slice::from_raw_parts(
            (*cmcf).servers.elts as *const *mut sys::ngx_http_core_srv_conf_t,
            (*cmcf).servers.nelts,
        );
        for &cscf in servers {
            let clcf = core_loc_conf((*(*cscf).ctx).loc_conf);
            visit(clcf, &mut users);
            let mut named = (*cscf).named_locations;
            while !named.is_null() && !(*named).is_null() {
                visit(*named, &mut users);
                named = named.add(1);
            }
        }
    }
    users
}

/// The core module's location conf among a context's `loc_conf` slots.
///
/// # Safety
/// `loc_conf` must be a context's array of location confs.
unsafe fn core_loc_conf(
    loc_conf: *mut *mut std::ffi::c_void,
) -> *mut sys::ngx_http_core_loc_conf_t {
    // SAFETY: loc_conf is a context's array of location confs (the contract),
    // which has a slot for every http module, the core module's among them.
    unsafe { *loc_conf.add(sys::ngx_http_core_module.ctx_index) as *mut _ }
}

/// `clcf` and every location nested in it.
///
/// # Safety
/// `clcf` must be null or a core location conf of a configured cycle.
unsafe fn visit(clcf: *mut sys::ngx_http_core_loc_conf_t, users: &mut Vec<AioUser>) {
    if clcf.is_null() {
        return;
    }
    // SAFETY: clcf is a core location conf of a configured cycle (the
    // contract, null returned above); the nested trees and arrays are built by
    // nginx from the same configuration.
    unsafe {
        if !(*clcf).thread_pool.is_null() {
            users.push(AioUser {
                location: String::from_utf8_lossy(super::str_bytes(&(*clcf).name)).into_owned(),
                pool: (*clcf).thread_pool,
            });
        }
        visit_tree((*clcf).static_locations, users);
        let mut regex = (*clcf).regex_locations;
        while !regex.is_null() && !(*regex).is_null() {
            visit(*regex, users);
            regex = regex.add(1);
        }
    }
}

/// The locations of a static location tree.
///
/// # Safety
/// `node` must be null or a node of a built location tree.
unsafe fn visit_tree(node: *mut sys::ngx_http_location_tree_node_t, users: &mut Vec<AioUser>) {
    if node.is_null() {
        return;
    }
    // SAFETY: node is a node of a built location tree (the contract, null
    // returned above), whose exact and inclusive locations and left, right and
    // tree nodes are null or built.
    unsafe {
        visit((*node).exact, users);
        if (*node).inclusive != (*node).exact {
            visit((*node).inclusive, users);
        }
        visit_tree((*node).left, users);
        visit_tree((*node).right, users);
        visit_tree((*node).tree, users);
    }
}
