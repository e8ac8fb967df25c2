/* The model and its input, from the model directory (on the assembler's
   include path: -Wa,-I,DIR). The .mote file must be 4-byte aligned (16
   here, as the Rust side does). */
    .section .rodata.mote_model, "a"
    .balign 16
    .global mote_model_data
mote_model_data:
    .incbin "model.mote"
    .global mote_model_end
mote_model_end:

    .section .rodata.mote_input, "a"
    .balign 4
    .global mote_input_data
mote_input_data:
    .incbin "input.bin"
    .global mote_input_end
mote_input_end:
