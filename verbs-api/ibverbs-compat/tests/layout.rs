//! The struct layouts the library uses against what gcc makes of Debian's
//! <infiniband/verbs.h> (bindgen reads the headers with clang; this checks
//! the compiler the applications were built with agrees).

use std::process::Command;

use ferroce_ibverbs_compat::ffi;

macro_rules! facts {
    ($($t:ident { $($f:ident),* }),* $(,)?) => {{
        let mut rust = Vec::new();
        let mut c = String::new();
        $(
            rust.push(format!("sizeof {} {}", stringify!($t), std::mem::size_of::<ffi::$t>()));
            c.push_str(&format!(
                "printf(\"sizeof {} %zu\\n\", sizeof(struct {}));\n",
                stringify!($t), stringify!($t)
            ));
            $(
                rust.push(format!(
                    "offsetof {}.{} {}",
                    stringify!($t), stringify!($f), std::mem::offset_of!(ffi::$t, $f)
                ));
                c.push_str(&format!(
                    "printf(\"offsetof {}.{} %zu\\n\", offsetof(struct {}, {}));\n",
                    stringify!($t), stringify!($f), stringify!($t), stringify!($f)
                ));
            )*
        )*
        (rust, c)
    }};
}

#[test]
fn layouts_match_gcc() {
    if !std::path::Path::new("/usr/include/infiniband/verbs.h").exists() {
        eprintln!("SKIP layouts_match_gcc: libibverbs-dev is not installed");
        return;
    }
    let (rust, body) = facts!(
        ibv_context {
            device,
            ops,
            cmd_fd,
            async_fd,
            num_comp_vectors,
            mutex,
            abi_compat
        },
        verbs_context {
            query_port,
            create_cq_ex,
            query_device_ex,
            create_qp_ex,
            sz,
            context
        },
        ibv_context_ops {
            poll_cq,
            req_notify_cq,
            post_srq_recv,
            post_send,
            post_recv
        },
        ibv_device {
            node_type,
            transport_type,
            name,
            dev_name,
            dev_path,
            ibdev_path
        },
        ibv_wc {
            wr_id,
            status,
            opcode,
            byte_len,
            qp_num,
            src_qp,
            wc_flags,
            pkey_index,
            slid,
            sl
        },
        ibv_send_wr {
            wr_id,
            next,
            sg_list,
            num_sge,
            opcode,
            send_flags,
            wr,
            qp_type
        },
        ibv_recv_wr {
            wr_id,
            next,
            sg_list,
            num_sge
        },
        ibv_sge { addr, length, lkey },
        ibv_qp {
            context,
            qp_context,
            pd,
            send_cq,
            recv_cq,
            srq,
            handle,
            qp_num,
            state,
            qp_type
        },
        ibv_qp_ex {
            qp_base,
            comp_mask,
            wr_id,
            wr_flags,
            wr_rdma_write,
            wr_set_sge,
            wr_start,
            wr_complete,
            wr_abort,
            wr_set_ud_addr,
            wr_set_inline_data
        },
        ibv_qp_attr {
            qp_state,
            path_mtu,
            qkey,
            rq_psn,
            sq_psn,
            dest_qp_num,
            qp_access_flags,
            cap,
            ah_attr,
            pkey_index,
            max_rd_atomic,
            max_dest_rd_atomic,
            min_rnr_timer,
            port_num,
            timeout,
            retry_cnt,
            rnr_retry
        },
        ibv_ah_attr {
            grh,
            dlid,
            sl,
            is_global,
            port_num
        },
        ibv_global_route {
            dgid,
            flow_label,
            sgid_index,
            hop_limit,
            traffic_class
        },
        ibv_qp_init_attr_ex {
            qp_context,
            send_cq,
            recv_cq,
            srq,
            cap,
            qp_type,
            sq_sig_all,
            comp_mask,
            pd,
            send_ops_flags
        },
        ibv_cq {
            context,
            channel,
            cq_context,
            handle,
            cqe,
            comp_events_completed
        },
        ibv_mr {
            context,
            pd,
            addr,
            length,
            handle,
            lkey,
            rkey
        },
        ibv_port_attr {
            state,
            max_mtu,
            active_mtu,
            gid_tbl_len,
            link_layer,
            flags,
            port_cap_flags2
        },
        ibv_device_attr {
            fw_ver,
            node_guid,
            max_qp,
            atomic_cap,
            max_srq_sge,
            phys_port_cnt
        },
        ibv_device_attr_ex {
            orig_attr,
            comp_mask,
            phys_port_cnt_ex
        },
        ibv_gid_entry {
            gid,
            gid_index,
            port_num,
            gid_type,
            ndev_ifindex
        },
        ibv_srq_init_attr { srq_context, attr },
        ibv_comp_channel {
            context,
            fd,
            refcnt
        },
    );
    let dir = std::env::temp_dir().join(format!("ferroce-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    std::fs::write(
        &src,
        format!(
            "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\n\
             int main(void) {{\n{body}return 0;\n}}\n"
        ),
    )
    .unwrap();
    let exe = dir.join("layout");
    let cc = Command::new("gcc").arg("-o").arg(&exe).arg(&src).output();
    let cc = match cc {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIP layouts_match_gcc: gcc: {e}");
            return;
        }
    };
    assert!(
        cc.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    let c: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(rust.len(), c.len());
    for (r, g) in rust.iter().zip(&c) {
        assert_eq!(r, g, "Rust vs gcc");
    }
}
