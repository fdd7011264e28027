//! The rest of libibverbs' ABI: what a program or a library linked with it
//! (libmlx5, libefa, librdmacm) may import, which ferroce does not back.
//! They exist so the dynamic loader resolves every import; called, they fail
//! the way rdma-core does for an unsupported operation (EOPNOTSUPP).
//!
//! The `ibv_cmd_*` / `verbs_*` / `execute_ioctl` entries are rdma-core's
//! kernel-command layer for hardware providers; no provider runs here
//! (`verbs_register_driver_34` ignores them), so nothing reaches them.
//! Arguments are not declared: on x86-64 System V the caller owns its
//! arguments, so a function that ignores them may omit them.

use std::ffi::c_int;

use crate::handles::set_errno;

macro_rules! fail_int {
    ($($name:ident),* $(,)?) => {$(
        /// Unsupported by ferroce: EOPNOTSUPP.
        #[no_mangle]
        pub extern "C" fn $name() -> c_int {
            set_errno(libc::EOPNOTSUPP);
            libc::EOPNOTSUPP
        }
    )*};
}

macro_rules! fail_ptr {
    ($($name:ident),* $(,)?) => {$(
        /// Unsupported by ferroce: NULL with errno EOPNOTSUPP.
        #[no_mangle]
        pub extern "C" fn $name() -> *mut std::ffi::c_void {
            set_errno(libc::EOPNOTSUPP);
            std::ptr::null_mut()
        }
    )*};
}

macro_rules! nothing {
    ($($name:ident),* $(,)?) => {$(
        /// Nothing to do here (kernel-ABI copies and provider set-up, unused by ferroce).
        #[no_mangle]
        pub extern "C" fn $name() {}
    )*};
}

fail_int!(
    execute_ioctl,
    ibv_query_ece,
    ibv_set_ece,
    ibv_rereg_mr,
    ibv_resolve_eth_l2_from_gid,
    ibv_read_ibdev_sysfs_file,
    ibv_cmd_advise_mr,
    ibv_cmd_alloc_dm,
    ibv_cmd_alloc_mw,
    ibv_cmd_alloc_pd,
    ibv_cmd_attach_mcast,
    ibv_cmd_close_xrcd,
    ibv_cmd_create_ah,
    ibv_cmd_create_counters,
    ibv_cmd_create_cq,
    ibv_cmd_create_cq_ex,
    ibv_cmd_create_flow,
    ibv_cmd_create_flow_action_esp,
    ibv_cmd_create_qp,
    ibv_cmd_create_qp_ex,
    ibv_cmd_create_qp_ex2,
    ibv_cmd_create_rwq_ind_table,
    ibv_cmd_create_srq,
    ibv_cmd_create_srq_ex,
    ibv_cmd_create_wq,
    ibv_cmd_dealloc_mw,
    ibv_cmd_dealloc_pd,
    ibv_cmd_dereg_mr,
    ibv_cmd_destroy_ah,
    ibv_cmd_destroy_counters,
    ibv_cmd_destroy_cq,
    ibv_cmd_destroy_flow,
    ibv_cmd_destroy_flow_action,
    ibv_cmd_destroy_qp,
    ibv_cmd_destroy_rwq_ind_table,
    ibv_cmd_destroy_srq,
    ibv_cmd_destroy_wq,
    ibv_cmd_detach_mcast,
    ibv_cmd_free_dm,
    ibv_cmd_get_context,
    ibv_cmd_modify_cq,
    ibv_cmd_modify_flow_action_esp,
    ibv_cmd_modify_qp,
    ibv_cmd_modify_qp_ex,
    ibv_cmd_modify_srq,
    ibv_cmd_modify_wq,
    ibv_cmd_open_qp,
    ibv_cmd_open_xrcd,
    ibv_cmd_poll_cq,
    ibv_cmd_post_recv,
    ibv_cmd_post_send,
    ibv_cmd_post_srq_recv,
    ibv_cmd_query_context,
    ibv_cmd_query_device_any,
    ibv_cmd_query_mr,
    ibv_cmd_query_port,
    ibv_cmd_query_qp,
    ibv_cmd_query_srq,
    ibv_cmd_read_counters,
    ibv_cmd_reg_dm_mr,
    ibv_cmd_reg_dmabuf_mr,
    ibv_cmd_reg_mr,
    ibv_cmd_req_notify_cq,
    ibv_cmd_rereg_mr,
    ibv_cmd_resize_cq,
);

fail_ptr!(
    _verbs_init_and_alloc_context,
    verbs_open_device,
    ibv_import_device,
    ibv_import_dm,
    ibv_import_mr,
    ibv_import_pd,
    ibv_reg_dmabuf_mr,
);

nothing!(
    ibv_copy_ah_attr_from_kern,
    ibv_copy_path_rec_from_kern,
    ibv_copy_path_rec_to_kern,
    ibv_copy_qp_attr_from_kern,
    ibv_unimport_dm,
    ibv_unimport_mr,
    ibv_unimport_pd,
    verbs_init_cq,
    verbs_set_ops,
    verbs_uninit_context,
);

/// No ioctl attributes are ever built here.
#[no_mangle]
pub extern "C" fn __ioctl_final_num_attrs() -> u32 {
    0
}

/// Contexts are never disassociated from a kernel device here.
#[no_mangle]
pub extern "C" fn verbs_allow_disassociate_destroy() -> bool {
    false
}
